"""Every atomic Redis state transition of twinflow, one Lua script each.

All keys of a flow share the hash tag ``{<flow>}``, so a script that builds
further keys from a prefix (the ID cache) still touches one cluster slot.
Scripts are registered once per client (``register``) and called with
``client=pipe`` where they batch.
"""

# RAISE_EPOCH: make the flow's fencing epoch at least ARGV[1].
# KEYS[1] epoch key.  ARGV[1] the new master's epoch.
# Returns the epoch in force afterwards (larger than ARGV[1] means the caller is stale).
RAISE_EPOCH = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local new = tonumber(ARGV[1])
if new > cur then
  redis.call('SET', KEYS[1], ARGV[1])
  return new
end
return cur
"""

# DELIVER: fenced delivery of a batch to the sink, recording each ID in the
# ID cache in the same atomic step.
# KEYS[1] epoch key, KEYS[2] sink stream.
# ARGV[1] writer's epoch, ARGV[2] ID-cache TTL (s), ARGV[3] ID-cache key prefix,
# ARGV[4] writer's node id, then (id, position, body) triples.
# Returns {-1, epoch in force} when the writer is stale (nothing written), else
# {1, f1, f2, ...} with fi = 1 delivered now, 0 already in the ID cache.
DELIVER = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local epoch = tonumber(ARGV[1])
if epoch < cur then
  return {-1, cur}
end
local out = {1}
for i = 5, #ARGV, 3 do
  local id = ARGV[i]
  if redis.call('SET', ARGV[3] .. id, ARGV[1], 'NX', 'EX', ARGV[2]) then
    redis.call('XADD', KEYS[2], '*', 'id', id, 'position', ARGV[i + 1], 'epoch', ARGV[1],
               'node', ARGV[4], 'data', ARGV[i + 2])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
"""

# RECORD_FAILURE: put a bad uplink entry on the failure stream once, however
# many nodes read it (keyed by its uplink position, so no epoch is needed: a
# second writer changes nothing).
# KEYS[1] failure stream.  ARGV[1] TTL (s) of the seen-marker, ARGV[2] marker
# prefix, ARGV[3] node id, then (position, reason, body) triples.
# Returns how many were recorded now.
RECORD_FAILURE = """
local n = 0
for i = 4, #ARGV, 3 do
  if redis.call('SET', ARGV[2] .. ARGV[i], ARGV[3], 'NX', 'EX', ARGV[1]) then
    redis.call('XADD', KEYS[1], '*', 'position', ARGV[i], 'reason', ARGV[i + 1],
               'node', ARGV[3], 'data', ARGV[i + 2])
    n = n + 1
  end
end
return n
"""

ALL = {"raise_epoch": RAISE_EPOCH, "deliver": DELIVER, "record_failure": RECORD_FAILURE}


def register(client) -> dict:
    """The scripts bound to ``client`` (redis-py Script objects, loaded lazily by SHA)."""
    return {name: client.register_script(src) for name, src in ALL.items()}
