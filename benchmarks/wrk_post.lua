-- wrk script for the overhead benchmark: POST a booking with the right headers.
-- Environment: BENCH_PATH, BENCH_MODE (bare|first|replay|storm), BENCH_AUTH,
-- BENCH_PREFIX (unique per run), BENCH_GROUP (storm: requests sharing one key).
local path = os.getenv("BENCH_PATH") or "/api/bookings/"
local mode = os.getenv("BENCH_MODE") or "first"
local auth = os.getenv("BENCH_AUTH")
local prefix = os.getenv("BENCH_PREFIX") or "wrk"
local group = tonumber(os.getenv("BENCH_GROUP") or "8")
local body = '{"slot": "2026-07-30T09:00:00Z", "customer": "Dana Whitfield"}'
local threads = {}
local counter = 0
statuses = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end

function request()
  counter = counter + 1
  local key
  if mode == "first" or mode == "bare" then
    key = prefix .. "-" .. tid .. "-" .. counter
  elseif mode == "replay" then
    key = prefix .. "-replay"
  elseif mode == "storm" then
    key = prefix .. "-" .. tid .. "-" .. math.floor((counter - 1) / group)
  end
  local headers = {
    ["Content-Type"] = "application/json",
    ["Authorization"] = auth,
    ["X-Location-Id"] = "portland",
    ["Idempotency-Key"] = key,
  }
  return wrk.format("POST", path, headers, body)
end

function response(status, headers, _)
  local label = tostring(status)
  if headers["Idempotency-Replayed"] then
    label = label .. "r"
  end
  statuses[label] = (statuses[label] or 0) + 1
end

function done(summary, latency, _)
  local merged = {}
  for _, thread in ipairs(threads) do
    local counts = thread:get("statuses")
    for label, count in pairs(counts) do
      merged[label] = (merged[label] or 0) + count
    end
  end
  local parts = {}
  for label, count in pairs(merged) do
    table.insert(parts, string.format('"%s": %d', label, count))
  end
  local errors = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests": %d, "duration_us": %d, "p50_us": %d, "p95_us": %d, '
      .. '"p99_us": %d, "errors": %d, "statuses": {%s}}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(95),
    latency:percentile(99), errors.connect + errors.read + errors.write + errors.timeout,
    table.concat(parts, ", ")))
end
