"""The Redis store's Lua scripts: each one step of the store, atomic on the server.

Every script reads and writes one entry (``KEYS[1]``), except ``COUNT_KEYS_SCRIPT``,
which keeps a principal's index of keys. The value format they parse and write is
:mod:`~idempotency_django.stores.redis_values`'s, described in docs/stores.md.
"""

# read_entry(key): the entry's value (false when there is none), and its header when
# the value is format 1 (else nil). Every script but COUNT_KEYS_SCRIPT reads this way.
_LUA_READ = """
local function read_entry(key)
  local value = redis.call('GET', key)
  local newline = value and string.find(value, '\\n', 1, true)
  if newline then
    local ok, head = pcall(cjson.decode, string.sub(value, 1, newline - 1))
    if ok and type(head) == 'table' and head['v'] == 1 then
      return value, head
    end
  end
  return value, nil
end
"""

# The preamble of the scripts that act only for the request holding the entry's
# reservation (complete, release, renew; ARGV[1] is its token): ``gone`` when the
# entry is, ``reservation`` its header when it is the in-progress reservation made
# with that token (else nil).
_LUA_OUR_RESERVATION = (
    _LUA_READ
    + """
local value, reservation = read_entry(KEYS[1])
local gone = not value
if reservation and (reservation['state'] ~= 'in_progress' or reservation['token'] ~= ARGV[1]) then
  reservation = nil
end
"""
)

# KEYS[1] the entry; ARGV: fingerprint, the reservation's value, lock timeout (ms),
# then other fingerprints of the same request (under SECRET_KEY_FALLBACKS, 0.1's).
# Returns {"claimed"}, {"in_progress"}, {"reused"} or {"replay", value}.
CLAIM_SCRIPT = (
    _LUA_READ
    + """
local value, head = read_entry(KEYS[1])
if head then
  local same = head['fp'] == ARGV[1]
  for i = 4, #ARGV do
    same = same or head['fp'] == ARGV[i]
  end
  if not same then
    return {'reused'}
  end
  if head['state'] == 'in_progress' then
    return {'in_progress'}
  end
  if head['state'] == 'completed' then
    return {'replay', value}
  end
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return {'claimed'}
"""
)

# KEYS[1] the entry; ARGV: token, retention (ms), status, headers (JSON), body,
# "1" to store even when the entry is gone (our reservation expired and nobody
# claimed the key since), the fingerprint to keep then, and "1" when the body
# was too large to keep (MAX_STORED_BODY).
# Returns 1 when stored, 0 when another request owns the key or it was stored already.
COMPLETE_SCRIPT = (
    _LUA_OUR_RESERVATION
    + """
local fp = ARGV[7]
if reservation then
  fp = reservation['fp']
elseif not (gone and ARGV[6] == '1') then
  return 0
end
local omitted = ARGV[8] == '1' and ',"omitted":true' or ''
local completed = '{"v":1,"state":"completed","token":' .. cjson.encode(ARGV[1])
  .. ',"fp":' .. cjson.encode(fp) .. ',"status":' .. ARGV[3]
  .. ',"headers":' .. ARGV[4] .. omitted .. '}\\n' .. ARGV[5]
redis.call('SET', KEYS[1], completed, 'PX', ARGV[2])
redis.call('PUBLISH', KEYS[1] .. ':settled', 'completed')
return 1
"""
)

# KEYS[1] the entry; ARGV: token. Returns 1 when the reservation was dropped.
RELEASE_SCRIPT = (
    _LUA_OUR_RESERVATION
    + """
if reservation then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[1] .. ':settled', 'released')
  return 1
end
return 0
"""
)

# KEYS[1] the entry; ARGV: token, lock timeout (ms), the reservation's value
# should it have to be made again, "1" to make it again if it is gone (not for
# the heartbeat). Returns 1 when the reservation is ours.
RENEW_SCRIPT = (
    _LUA_OUR_RESERVATION
    + """
if reservation then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if gone and ARGV[4] == '1' then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[2])
  return 1
end
return 0
"""
)

# KEYS[1] a principal's index of keys (a sorted set: record digest -> expiry in
# ms); ARGV: this key's digest, its longest lifetime (ms). Adds it, forgets the
# expired ones, and returns {count, ms until the first of the others expires}.
COUNT_KEYS_SCRIPT = """
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
-- The index lives as long as its longest-lived key: never shortened by a shorter one.
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
-- As a whole number: a score's text may be in scientific notation (Redis 7.2 and later).
redis.call('PEXPIREAT', KEYS[1], string.format('%d', tonumber(last[2])))
local first = redis.call('ZRANGE', KEYS[1], 0, 1, 'WITHSCORES')
local wait = -1
if first[1] and first[1] ~= ARGV[1] then
  wait = tonumber(first[2]) - now
elseif first[3] then
  wait = tonumber(first[4]) - now
end
return {redis.call('ZCARD', KEYS[1]), wait}
"""

# KEYS[1] the entry. Returns {state, status or "", ms to live}, or nil.
LOOKUP_SCRIPT = (
    _LUA_READ
    + """
local _, head = read_entry(KEYS[1])
if not head then
  return nil
end
local status = head['status'] and tostring(head['status']) or ''
return {head['state'], status, redis.call('PTTL', KEYS[1])}
"""
)
