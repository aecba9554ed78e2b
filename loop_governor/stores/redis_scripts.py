"""The Redis store's Lua scripts: every shared state change is one script, so a transition
is atomic across the fleet.

The scripts mirror [`loop_governor.state.breaker`][loop_governor.state.breaker] and
[`loop_governor.state.bucket`][loop_governor.state.bucket] line by line (a differential test runs
both on random operation sequences); the pure Python functions remain the specification.
"""

from __future__ import annotations

from typing import Any, NamedTuple

# --- Lua ------------------------------------------------------------------------------
# Numbers cross the Lua boundary as strings: Redis truncates Lua numbers to integers in
# replies, and "%.17g" round-trips a double exactly, so Lua compares the same doubles
# Python would.

# Time: ARGV "now" is the governor's clock, or '' for the server's (TIME). Scripts that
# read TIME replicate by effects (the only mode since Redis 7; asked for explicitly where
# an older server needs it).
LUA_HELPERS = """
if redis.replicate_commands then redis.replicate_commands() end
local function fmt(x) return string.format('%.17g', x) end
local function clock(arg)
  if arg == '' then
    local t = redis.call('TIME')
    return tonumber(t[1]) + tonumber(t[2]) / 1000000
  end
  return tonumber(arg)
end
local function load(key)
  local h = redis.call('HMGET', key, 's', 'f', 'o', 'p')
  return (h[1] or 'closed'), (tonumber(h[2]) or 0), (tonumber(h[3]) or 0), (tonumber(h[4]) or 0)
end
local function put(key, s, f, o, p, ttl)
  redis.call('HSET', key, 's', s, 'f', f, 'o', fmt(o), 'p', fmt(p))
  redis.call('PEXPIRE', key, ttl)
end
"""

# breaker.admit() for a breaker that was not closed when read. ARGV: now, cooldown_s, ttl_ms.
# Replies: {'closed', failures} | {'probe', from_state} | {'deny', state, failures, retry_in}
# A stamp in the future (the clock stepped back) moves to now: never a negative elapsed time.
ADMIT_LUA = (
    LUA_HELPERS
    + """
local s, f, o, p = load(KEYS[1])
if s == 'closed' then return {'closed', tostring(f)} end
local now, cooldown, ttl = clock(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if s == 'open' then
  if now < o then
    o = now
    put(KEYS[1], s, f, o, p, ttl)
  end
  local ready_at = o + cooldown
  if now >= ready_at then
    put(KEYS[1], 'half_open', f, o, now, ttl)
    return {'probe', 'open'}
  end
  return {'deny', s, tostring(f), fmt(ready_at - now)}
end
if now < p then
  p = now
  put(KEYS[1], s, f, o, p, ttl)
end
local stale_at = p + cooldown
if now >= stale_at then
  put(KEYS[1], s, f, o, now, ttl)
  return {'probe', ''}
end
return {'deny', s, tostring(f), fmt(stale_at - now)}
"""
)

# breaker.record(). ARGV: ok (1/0), probe (1/0), now, failure_threshold, ttl_ms, backdate_s.
# Reply: {} or {from_state, to_state}. A success on a healthy breaker writes nothing.
RECORD_LUA = (
    LUA_HELPERS
    + """
local s, f, o, p = load(KEYS[1])
local ok, probe = ARGV[1] == '1', ARGV[2] == '1'
if ok then
  if s == 'closed' then
    if f ~= 0 then put(KEYS[1], 'closed', 0, 0, 0, tonumber(ARGV[5])) end
    return {}
  end
  if s == 'half_open' and probe then
    put(KEYS[1], 'closed', 0, 0, 0, tonumber(ARGV[5]))
    return {'half_open', 'closed'}
  end
  return {}
end
local now, threshold, ttl = clock(ARGV[3]) - tonumber(ARGV[6]), tonumber(ARGV[4]), tonumber(ARGV[5])
f = f + 1
if s == 'half_open' then
  if probe then
    put(KEYS[1], 'open', f, now, 0, ttl)
    return {'half_open', 'open'}
  end
  put(KEYS[1], s, f, o, p, ttl)
  return {}
end
if s == 'open' then
  put(KEYS[1], s, f, o, p, ttl)
  return {}
end
if f >= threshold then
  put(KEYS[1], 'open', f, now, 0, ttl)
  return {'closed', 'open'}
end
put(KEYS[1], s, f, o, p, ttl)
return {}
"""
)

# breaker.force(). ARGV: state, now, ttl_ms.
FORCE_LUA = (
    LUA_HELPERS
    + """
local s = ARGV[1]
if s == 'closed' then
  put(KEYS[1], 'closed', 0, 0, 0, tonumber(ARGV[3]))
else
  put(KEYS[1], s, 0, clock(ARGV[2]), 0, tonumber(ARGV[3]))
end
return 1
"""
)

# Reconvergence after an outage: a breaker that tripped locally is written to Redis
# unless Redis already holds a non-closed one (the fleet's view wins). ARGV: s, f, o, p, ttl_ms.
MERGE_BREAKER_LUA = (
    LUA_HELPERS
    + """
local s = load(KEYS[1])
if s ~= 'closed' then return 0 end
put(KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))
return 1
"""
)

# MemoryStore.budget_take(). ARGV: limit, ttl_ms. Reply 1 (taken) or 0 (spent).
BUDGET_LUA = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
if used >= tonumber(ARGV[1]) then return 0 end
redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

# One hash field set (mode 'set') or incremented (mode 'incr'), and the key's TTL refreshed,
# in one step. ARGV: mode, field, value, ttl_ms. Reply: the field's new value.
HASH_LUA = """
local v
if ARGV[1] == 'incr' then
  v = redis.call('HINCRBY', KEYS[1], ARGV[2], ARGV[3])
else
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
  v = 1
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return v
"""

# Token buckets, all or nothing (loop_governor.state.bucket.take_all): every bucket is
# refilled; if each holds its cost (capped at its burst) all are debited their whole cost
# (a bucket may go into debt), else none is and the longest wait is returned. A clock
# that steps back neither refills nor freezes the bucket (its stamp moves to now). A key
# lives at least twice its refill time.
# KEYS: buckets (one hash tag). ARGV: now ('' = server time), then per bucket: rate_per_s,
# burst, cost, ttl_ms. Reply: seconds to wait ('0' = admitted).
RATE_LUA = """
if redis.replicate_commands then redis.replicate_commands() end
local now = tonumber(ARGV[1])
if ARGV[1] == '' then
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) + tonumber(tm[2]) / 1000000
end
local tokens, stamps, wait = {}, {}, 0
for i, key in ipairs(KEYS) do
  local rate, burst, cost = tonumber(ARGV[4 * i - 2]), tonumber(ARGV[4 * i - 1]), tonumber(ARGV[4 * i])
  local h = redis.call('HMGET', key, 't', 'ts')
  local t, ts = tonumber(h[1]), tonumber(h[2])
  if t == nil or ts == nil then t, ts = burst, now end
  if now > ts then
    t = math.min(burst, t + (now - ts) * rate)
  end
  ts = now
  local need = math.min(cost, burst)
  if need - t > 1e-9 * need then wait = math.max(wait, (need - t) / rate) end
  tokens[i], stamps[i] = t, ts
end
for i, key in ipairs(KEYS) do
  local t = tokens[i]
  if wait == 0 then t = t - tonumber(ARGV[4 * i]) end
  redis.call('HSET', key, 't', string.format('%.17g', t), 'ts', string.format('%.17g', stamps[i]))
  -- a debt left by an earlier, larger request outlives this request's own TTL: the key
  -- must not expire (a full bucket) before the bucket has refilled
  local refill = 2000 * (tonumber(ARGV[4 * i - 1]) - t) / tonumber(ARGV[4 * i - 2])
  redis.call('PEXPIRE', key, string.format('%.0f', math.max(tonumber(ARGV[4 * i + 1]), math.ceil(refill))))
end
return string.format('%.17g', wait)
"""


def num(x: float) -> str:
    """A float as text Lua's tonumber reads back to the same double."""
    return repr(float(x))


class Scripts(NamedTuple):
    """The scripts registered on one client (redis-py's ``Script``: EVALSHA, loading the
    script on ``NOSCRIPT``)."""

    admit: Any
    record: Any
    force: Any
    merge_breaker: Any
    budget: Any
    hash: Any
    rate: Any


def register(client: Any) -> Scripts:
    """Register every script on ``client`` (no round trip: loaded on first use)."""
    return Scripts(
        admit=client.register_script(ADMIT_LUA),
        record=client.register_script(RECORD_LUA),
        force=client.register_script(FORCE_LUA),
        merge_breaker=client.register_script(MERGE_BREAKER_LUA),
        budget=client.register_script(BUDGET_LUA),
        hash=client.register_script(HASH_LUA),
        rate=client.register_script(RATE_LUA),
    )
