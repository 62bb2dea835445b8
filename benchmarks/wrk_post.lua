-- wrk script: POST the booking body. Environment: BENCH_MODE (bare: no key;
-- first: a new key per request; replay: the stored keys of BENCH_KEYS, in
-- turn, so that concurrent requests rarely share one), BENCH_PREFIX
-- (8 hex digits, unique per run; keys are UUIDs, as one peer requires),
-- BENCH_HEADERS (lines "Name: value": credentials, cookies).
local mode = os.getenv("BENCH_MODE") or "first"
local prefix = os.getenv("BENCH_PREFIX") or "wrk"
local replay_keys = {}
for key in string.gmatch(os.getenv("BENCH_KEYS") or "", "[^,]+") do
  table.insert(replay_keys, key)
end
local body = '{"slot": "2026-07-30T09:00:00Z", "customer": "Dana Whitfield"}'
local headers = {["Content-Type"] = "application/json", ["X-Location-Id"] = "portland"}
for name, value in string.gmatch(os.getenv("BENCH_HEADERS") or "", "([^:\n]+): ([^\n]*)") do
  headers[name] = value
end
local threads = {}
local counter = 0
statuses = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end

function request()
  counter = counter + 1
  if mode == "replay" then
    headers["Idempotency-Key"] = replay_keys[((tid - 1) * 17 + counter) % #replay_keys + 1]
  elseif mode == "first" then
    headers["Idempotency-Key"] = string.format("%s-%04x-4000-8000-%012x", prefix, tid, counter)
  end
  return wrk.format("POST", nil, headers, body)
end

function response(status, response_headers, _)
  local label = tostring(status)
  if response_headers["Idempotency-Replayed"] then
    label = label .. "r"
  end
  statuses[label] = (statuses[label] or 0) + 1
end

function done(summary, latency, _)
  local merged = {}
  for _, thread in ipairs(threads) do
    for label, count in pairs(thread:get("statuses")) do
      merged[label] = (merged[label] or 0) + count
    end
  end
  local parts = {}
  for label, count in pairs(merged) do
    table.insert(parts, string.format('"%s": %d', label, count))
  end
  local errors = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests": %d, "duration_us": %d, "p50_us": %d, "errors": %d, "statuses": {%s}}\n',
    summary.requests, summary.duration, latency:percentile(50),
    errors.connect + errors.read + errors.write + errors.timeout, table.concat(parts, ", ")))
end
