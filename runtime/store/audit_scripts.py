"""The audit's atomic Redis state transitions, one Lua script each: mark an entry (resubmit or
discard it, once) and trim the audit (counting what goes unhandled).

They are part of ``scripts.ALL`` (registered with every store; every key they touch is declared
in KEYS, checked by ``tests/test_scripts.py``). The audit's own writes of FAILED entries,
outcomes and notices ride in the master's COMMIT and in RECORD_FAILURE (``scripts.py``).

Under failure: each script is all or nothing, and safe to send again after a lost reply: a
mark carries its call's token, and a second send of the same call finds its own mark and
answers as the first did (the uplink gets one envelope); a trim removes only what is still
there and counts only what it removed.
"""

# AUDIT_MARK: resubmit or discard one audit entry, once.
# KEYS[1] the audit stream, KEYS[2] the marks hash (audit ID -> JSON), KEYS[3] the uplink.
# ARGV[1] audit ID, ARGV[2] status (RESUBMITTED or DISCARDED), ARGV[3] who, ARGV[4] the call's
# token, ARGV[5] the envelope to add to the uplink (RESUBMITTED only).
# The mark is JSON: status, by, at (the Redis server's time, seconds), token, and for a
# resubmit the uplink position of its envelope.
# Returns {1, mark} when applied (or applied before by this same call), {0} when the audit has
# no such entry, {2, mark} when the entry was marked before (nothing changed).
AUDIT_MARK = """
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then
  return {0}
end
local before = redis.call('HGET', KEYS[2], ARGV[1])
if before then
  if cjson.decode(before).token == ARGV[4] then return {1, before} end
  return {2, before}
end
local t = redis.call('TIME')
local mark = {status = ARGV[2], by = ARGV[3], token = ARGV[4],
              at = string.format('%.3f', tonumber(t[1]) + tonumber(t[2]) / 1000000)}
if ARGV[2] == 'RESUBMITTED' then
  mark.position = redis.call('XADD', KEYS[3], '*', 'data', ARGV[5])
end
local text = cjson.encode(mark)
redis.call('HSET', KEYS[2], ARGV[1], text)
return {1, text}
"""

# TRIM_AUDIT: remove the audit entries older than the cut-off, and the oldest beyond the newest
# max_entries, with their marks and outcomes, at most a budget per call; count how many of
# them were still FAILED (no mark: never resubmitted nor discarded) and add both counts to the
# counts hash (fields removed and removed_unhandled), so nothing leaves the audit uncounted.
# KEYS[1] the audit stream, KEYS[2] the marks hash, KEYS[3] the outcomes hash, KEYS[4] the counts hash.
# ARGV[1] the cut-off ("<ms>-0": entries before it are old), ARGV[2] max entries, ARGV[3] the
# most entries this call removes.
# Returns {removed, of them still FAILED, 1 when more are due (0 not), entries kept, FAILED kept}.
TRIM_AUDIT = """
local function before(a, b)
  local ams, aseq = string.match(a, '^(%d+)-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)-(%d+)$')
  ams, bms = tonumber(ams), tonumber(bms)
  if ams ~= bms then return ams < bms end
  return tonumber(aseq) < tonumber(bseq)
end
local over = redis.call('XLEN', KEYS[1]) - tonumber(ARGV[2])
local budget = tonumber(ARGV[3])
local removed, unhandled, more = 0, 0, 0
local done = false
while not done do
  local page = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 100)
  if #page == 0 then break end
  local ids = {}
  for _, entry in ipairs(page) do
    local id = entry[1]
    if removed + #ids >= over and not before(id, ARGV[1]) then
      done = true
      break
    end
    if removed + #ids >= budget then
      more, done = 1, true
      break
    end
    ids[#ids + 1] = id
    if redis.call('HDEL', KEYS[2], id) == 0 then
      unhandled = unhandled + 1
    end
    redis.call('HDEL', KEYS[3], id)
  end
  if #ids > 0 then
    redis.call('XDEL', KEYS[1], unpack(ids))
    removed = removed + #ids
  end
  if #ids < #page then done = true end
end
if removed > 0 then
  redis.call('HINCRBY', KEYS[4], 'removed', removed)
end
if unhandled > 0 then
  redis.call('HINCRBY', KEYS[4], 'removed_unhandled', unhandled)
end
local kept = redis.call('XLEN', KEYS[1])
return {removed, unhandled, more, kept, kept - redis.call('HLEN', KEYS[2])}
"""

ALL = {"audit_mark": AUDIT_MARK, "trim_audit": TRIM_AUDIT}
