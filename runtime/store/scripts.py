"""Every atomic Redis state transition of twinflow, one Lua script each.

All keys of a flow share the hash tag ``{<flow>}``, so every script touches
one cluster slot, and every script declares every key it touches in KEYS
(none builds a key name itself), as Redis Cluster requires. Scripts are
registered once per client (``register``); in a durable write's pipeline
each is queued by ``EVALSHA`` alone (:func:`queue`).

Two rules live here rather than in any caller, so that every writer keeps
them (promises 2 and 3, docs/concepts/promises.md):

- The fencing epoch never goes backwards: a commit raises the stored epoch
  to the writer's, so a Redis that lost its data cannot let an older writer
  pass once the newest master has written again.
- The processed mark: the flow's masters process the uplink in order, so the
  commit script records the position of the last entry a batch handled
  (``processed``), in the same step as that batch's outputs and node state.
  An entry at or before that mark is never processed again,
  whether or not its ID is still in the ID cache: a peer that re-reads the
  uplink (new state directory, down longer than ``id_ttl``) cannot double-feed.
"""

from . import audit_scripts, stream_retention

# Lua: true when stream entry ID a ("<ms>-<seq>") sorts at or before b.
_AT_OR_BEFORE = """
local function at_or_before(a, b)
  if not b then return false end
  local ams, aseq = string.match(a, '^(%d+)-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)-(%d+)$')
  ams, bms = tonumber(ams), tonumber(bms)
  if ams ~= bms then return ams < bms end
  return tonumber(aseq) <= tonumber(bseq)
end
"""

# How long a step's marker is kept: far longer than any retry of the step
# (bounded by the master's write lease, seconds).
STEP_MARKER_TTL_S = 3600

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

# COMMIT: one master step, fenced and atomic: what a batch (or a timer
# firing) wrote to outlinks, the node state it changed, the IDs it processed
# and how far it processed the uplink. Refused as a whole when a newer epoch
# exists. Applied at most once: the step's marker key (unique per step) is
# set with the step, so a retry after a lost reply changes nothing.
# KEYS[1] epoch key, KEYS[2] processed mark, KEYS[3] the step's marker,
# KEYS[4] the state version, KEYS[5 .. 4+n] the ID-cache keys of the n
# processed IDs, then every stream and state hash the operations name (every
# key declared, so a Redis Cluster can route the script; all share the flow's
# hash tag).
# ARGV[1] writer's epoch, ARGV[2] ID-cache TTL (s), ARGV[3] new processed mark
# ("" leaves it), ARGV[4] the guess guard ("" none, else "=" followed by the
# processed mark the writer assumes, "=" alone for none), ARGV[5] n, ARGV[6]
# the state version the step was computed from ("" none), then operations,
# each a code, the index of its key in KEYS and its arguments:
#   'X' k nf f1 v1 .. fnf vnf   XADD KEYS[k] * f1 v1 ..
#   'R' k nc c1 v1 .. cnc vnc nv f1 .. fnv m  x11 .. x1nv .. xm1 .. xmnv
#                              m XADDs: XADD KEYS[k] * c1 v1 .. f1 xj1 .. fnv xjnv
#                              (a run of outputs sharing their leading fields)
#   'M' k n f1 v1 .. fn vn     HSET KEYS[k] f1 v1 .. fn vn
#   'E' k n f1 .. fn           HDEL KEYS[k] f1 .. fn
#   'L' k cap nf f1 v1 ..      XADD KEYS[k] MAXLEN ~ cap * v <the new version> f1 v1 ..
#   'N' k p c cap nf f1 v1 ..  a notice: XADD KEYS[k] * publisher <GET KEYS[p], "" when p is 0
#                              or the key is gone> f1 v1 .., then XTRIM KEYS[k] MAXLEN ~ cap,
#                              the entries it removed added to the counter KEYS[c]
# 'L' is the change log (a flow whose nodes log their state changes: the
# history): one entry per step, numbered with the version the step makes, so a
# reader that follows it sees every step in order or knows it missed one
# (cluster/warm_state.py).
# The guard is how a master commits a batch without first asking which of its
# messages are processed (one round trip instead of two): it guessed from the
# mark it holds that every message after that mark with an ID not in the
# cache is new; the step applies only if the mark is still the one it assumed
# and none of the step's IDs is in the ID cache, which is exactly what asking
# first would have found.
# The state version: the flow's node state, mark and ID cache as one
# numbered state. Every applied step moves it by one, and a step names the
# version it was computed from: applied on any other version (another
# process, or another attempt of the same task, committed in between, or the
# step was built on a flow loaded before a step still in flight) it would
# apply to state its writer never saw, so it is refused and the writer loads
# the state again. Loaded with the state (FlowStore.load_state_version).
# None of a step's IDs may be in the ID cache either, guess or not: the IDs
# are the messages it takes as new, and one processed meanwhile is not.
# Returns {-1, epoch in force} when the writer is stale (nothing written),
# {2} when this step was applied before (nothing written again), {3} when the
# guard failed (nothing written), {4, version in force} when the step's
# version is not the one in force (nothing written), else {1, new version}.
COMMIT = _AT_OR_BEFORE + """
if redis.call('EXISTS', KEYS[3]) == 1 then
  return {2}
end
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local epoch = tonumber(ARGV[1])
if epoch < cur then
  return {-1, cur}
end
local n = tonumber(ARGV[5])
local version = tonumber(redis.call('GET', KEYS[4]) or '0')
if ARGV[6] ~= '' and tonumber(ARGV[6]) ~= version then
  return {4, version}
end
if ARGV[4] ~= '' and '=' .. (redis.call('GET', KEYS[2]) or '') ~= ARGV[4] then
  return {3}
end
for i = 5, 4 + n do
  if not redis.call('SET', KEYS[i], ARGV[1], 'NX', 'EX', ARGV[2]) then
    -- An ID already in the cache: the step is refused as a whole, so the IDs set
    -- before it (each absent until now) are taken back; nothing else is written yet.
    for j = 5, i - 1 do
      redis.call('DEL', KEYS[j])
    end
    return {3}
  end
end
redis.call('SET', KEYS[3], ARGV[1], 'EX', """ + str(STEP_MARKER_TTL_S) + """)
if epoch > cur then
  redis.call('SET', KEYS[1], ARGV[1])
end
local i = 7
while i <= #ARGV do
  local op, key = ARGV[i], KEYS[tonumber(ARGV[i + 1])]
  if op == 'X' then
    local nf = tonumber(ARGV[i + 2])
    redis.call('XADD', key, '*', unpack(ARGV, i + 3, i + 2 + 2 * nf))
    i = i + 3 + 2 * nf
  elseif op == 'R' then
    local nc = tonumber(ARGV[i + 2])
    local names = i + 3 + 2 * nc  -- ARGV[names] is nv, the names follow
    local nv = tonumber(ARGV[names])
    local m = tonumber(ARGV[names + nv + 1])
    local fields = {'*'}
    for c = 1, 2 * nc do
      fields[1 + c] = ARGV[i + 2 + c]
    end
    local base = 1 + 2 * nc
    for f = 1, nv do
      fields[base + 2 * f - 1] = ARGV[names + f]
    end
    local v = names + nv + 2
    for _ = 1, m do
      for f = 1, nv do
        fields[base + 2 * f] = ARGV[v]
        v = v + 1
      end
      redis.call('XADD', key, unpack(fields))
    end
    i = v
  elseif op == 'M' then
    local n = tonumber(ARGV[i + 2])
    redis.call('HSET', key, unpack(ARGV, i + 3, i + 2 + 2 * n))
    i = i + 3 + 2 * n
  elseif op == 'E' then
    local n = tonumber(ARGV[i + 2])
    redis.call('HDEL', key, unpack(ARGV, i + 3, i + 2 + n))
    i = i + 3 + n
  elseif op == 'L' then
    local nf = tonumber(ARGV[i + 3])
    redis.call('XADD', key, 'MAXLEN', '~', ARGV[i + 2], '*', 'v', tostring(version + 1),
               unpack(ARGV, i + 4, i + 3 + 2 * nf))
    i = i + 4 + 2 * nf
  elseif op == 'N' then
    local p, nf = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 5])
    local publisher = ''
    if p > 0 then
      publisher = redis.call('GET', KEYS[p]) or ''
    end
    redis.call('XADD', key, '*', 'publisher', publisher, unpack(ARGV, i + 6, i + 5 + 2 * nf))
    local gone = redis.call('XTRIM', key, 'MAXLEN', '~', ARGV[i + 4])
    if gone > 0 then
      redis.call('INCRBY', KEYS[tonumber(ARGV[i + 3])], gone)
    end
    i = i + 6 + 2 * nf
  else
    return redis.error_reply('COMMIT: unknown operation ' .. tostring(op))
  end
end
local mark = redis.call('GET', KEYS[2])
if ARGV[3] ~= '' and not at_or_before(ARGV[3], mark) then
  redis.call('SET', KEYS[2], ARGV[3])
end
return {1, redis.call('INCR', KEYS[4])}
"""

# RECORD_FAILURE: put a bad uplink entry on the failure stream once, however
# many peers read it (keyed by its uplink position, so no epoch is needed: a
# second writer changes nothing), and a FAILED entry for it in the flow's
# audit in the same script (its time the Redis server's, which the flow's
# clock follows; the audit is trimmed only by TRIM_AUDIT, which counts what it
# removes). The stream is capped (approximately) at
# ARGV[3] entries: a record that falls off still points at its uplink entry.
# An entry at or before the processed mark is not recorded: it was handled
# (recorded then), and its seen-marker, which lives as long as an ID in the
# ID cache, may be gone by the time a peer that restarts reads it again.
# KEYS[1] failure stream, KEYS[2] the processed mark, KEYS[3] the audit,
# KEYS[3+j] the seen-marker key of the j-th entry.
# ARGV[1] TTL (s) of the seen-markers, ARGV[2] peer id, ARGV[3] cap, ARGV[4]
# the flow's name, ARGV[5] the epoch the peer saw last, then one (position,
# reason, body, size) quadruple per entry.
# Returns how many were recorded now.
RECORD_FAILURE = _AT_OR_BEFORE + """
local n = 0
local mark = redis.call('GET', KEYS[2])
local t = redis.call('TIME')
local at = string.format('%.3f', tonumber(t[1]) + tonumber(t[2]) / 1000000)
for j = 1, #KEYS - 3 do
  local i = 2 + 4 * j
  if not at_or_before(ARGV[i], mark) and redis.call('SET', KEYS[3 + j], ARGV[2], 'NX', 'EX', ARGV[1]) then
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 'position', ARGV[i], 'reason', ARGV[i + 1],
               'node', ARGV[2], 'size', ARGV[i + 3], 'data', ARGV[i + 2])
    redis.call('XADD', KEYS[3], '*', 'flow', ARGV[4], 'node', '', 'outlink', '', 'reason', ARGV[i + 1],
               'at', at, 'id', '', 'position', ARGV[i], 'peer', ARGV[2], 'epoch', ARGV[5],
               'size', ARGV[i + 3], 'data', ARGV[i + 2])
    n = n + 1
  end
end
return n
"""

# RECORD_HANDLED: move a peer's handled position (field handled_id of its read
# hash) forward, never back: a late attempt of a task that read an earlier
# batch must not make a promoted peer's catch-up stop short of what it handled.
# KEYS[1] the peer's read hash. ARGV[1] the position it handled.
RECORD_HANDLED = _AT_OR_BEFORE + """
local cur = redis.call('HGET', KEYS[1], 'handled_id')
if not at_or_before(ARGV[1], cur) then
  redis.call('HSET', KEYS[1], 'handled_id', ARGV[1])
end
return 1
"""

# READ_BATCH: the entries of a stream after an ID, bounded in count and bytes.
# KEYS[1] the stream; then, optional, the reader's progress hash, and the
# flow's processed mark (last: see ARGV[8]).
# ARGV[1] exclusive start ID; ARGV[2] inclusive end ID, or "+" for none;
# ARGV[3] max entries (>= 1); ARGV[4] max body bytes returned, the first entry
# always included whatever its size; ARGV[5] max bytes of one body (a longer
# one is withheld and counts 0); ARGV[6] max entries per XRANGE page; ARGV[7]
# page bytes (pages shrink to about this many bytes once entries are big);
# ARGV[8] N > 0: the last key is the processed mark, and a read to the end
# ("+") starts after it when it is further (the entries skipped are
# processed: the masters' COMMIT moved the mark over them), counting them,
# at most N of them in one call (each is paged through to be counted, and a
# long count would hold Redis from everyone else): a call that stops at N
# short of the mark returns no entries, only how far it counted; ARGV[10]
# and ARGV[11] ("" and 0: none) say that an earlier call from the same start
# counted that many up to that ID, and counting goes on from there while
# that ID is still at or before the mark (else it starts again: a Redis
# failover can take a mark back);
# ARGV[9] read behind: with "+", no entry newer than this many ms before
# Redis's clock is read ("0": none); with the progress hash (KEYS[2]),
# ARGV[12] and ARGV[13] are recorded there first as read_n and read_id (how
# far the reader had read and processed: in the same call, so recording it
# costs the reader no round trip of its own).
# Returns a flat array: the entries skipped and the ID read after in their
# stead (false: none skipped), then three items per entry: ID, body (false
# when the entry has no data field or its body is withheld), body length
# (-1: no data field).
READ_BATCH = _AT_OR_BEFORE + """
local after, last = ARGV[1], ARGV[2]
local max_n, max_bytes = tonumber(ARGV[3]), tonumber(ARGV[4])
local max_body, max_page, page_bytes = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local out, n, bytes, page = {0, false}, 0, 0, max_page
if ARGV[12] then
  redis.call('HSET', KEYS[2], 'read_n', ARGV[12], 'read_id', ARGV[13])
end
local skip_cap = tonumber(ARGV[8])
if last == '+' and skip_cap > 0 then
  local mark = redis.call('GET', KEYS[#KEYS])
  if mark and at_or_before(after, mark) and after ~= mark then
    local skipped, from, capped = 0, after, false
    if ARGV[10] ~= '' and at_or_before(ARGV[10], mark) then
      skipped, from = tonumber(ARGV[11]), ARGV[10]
    end
    local cap = skipped + skip_cap
    while true do  -- counted (IDs only leave the script), so read_n stays exact
      local want = math.min(1024, cap - skipped)
      local entries = redis.call('XRANGE', KEYS[1], '(' .. from, mark, 'COUNT', want)
      skipped = skipped + #entries
      if #entries > 0 then from = entries[#entries][1] end
      if #entries < want then break end
      if skipped >= cap then
        capped = from ~= mark
        break
      end
    end
    if capped then  -- processed entries remain before the mark: the next call goes on from here
      out[1], out[2] = skipped, from
      return out
    end
    out[1], out[2], after = skipped, mark, mark
  end
end
if last == '+' and tonumber(ARGV[9]) > 0 then
  local now = redis.call('TIME')
  last = tostring(tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - tonumber(ARGV[9]))
  if not at_or_before(after, last .. '-18446744073709551615') then return out end
end
while n < max_n do
  local want = math.min(page, max_n - n)
  local entries = redis.call('XRANGE', KEYS[1], '(' .. after, last, 'COUNT', want)
  local biggest = 0
  for _, entry in ipairs(entries) do
    local fields, body, size = entry[2], false, -1
    for i = 1, #fields, 2 do
      if fields[i] == 'data' then body = fields[i + 1] end
    end
    if body then
      size = #body
      if size > biggest then biggest = size end
      if size > max_body then body = false end
    end
    local cost = body and size or 0
    if n > 0 and bytes + cost > max_bytes then return out end
    out[#out + 1] = entry[1]
    out[#out + 1] = body
    out[#out + 1] = size
    n = n + 1
    bytes = bytes + cost
    after = entry[1]
  end
  if #entries < want then break end
  page = math.max(1, math.min(max_page, math.floor(page_bytes / math.max(biggest, 1))))
end
return out
"""

# TRIM_UPLINK: drop the uplink entries no one needs any more (see
# FlowStore.trim_uplink): entries before the earliest of the processed mark,
# every live peer's read position and the retention cut-off. Nothing is
# trimmed before the flow processed anything or while a live peer has not
# recorded where it read. When entries went, the point they went up to is
# recorded (never moving back), so that a peer away for longer can tell.
# KEYS[1] the uplink, KEYS[2] the processed mark, KEYS[3] the trim record,
# KEYS[4..] the read hashes of the live peers. ARGV[1] the retention cut-off
# ("<ms>-0": entries at or after it are kept whatever else holds).
# Returns {entries trimmed, first entry ID kept or false}.
TRIM_UPLINK = _AT_OR_BEFORE + """
local point = redis.call('GET', KEYS[2])
if not point then return {0, false} end
if at_or_before(ARGV[1], point) then point = ARGV[1] end
for i = 4, #KEYS do
  local read = redis.call('HGET', KEYS[i], 'read_id')
  if not read then return {0, false} end
  if at_or_before(read, point) then point = read end
end
local before = redis.call('GET', KEYS[3])
if before and at_or_before(point, before) then return {0, before} end
local n = redis.call('XTRIM', KEYS[1], 'MINID', point)
if n == 0 then return {0, before or false} end
redis.call('SET', KEYS[3], point)
return {n, point}
"""

# XRANGE page inside the script: at most this many entries ...
_PAGE_ENTRIES = 64
# ... and, once a page has shown entries this big, fewer, so the script's own
# copy of a page of large entries stays near this many bytes.
_PAGE_BYTES = 8 * 1024 * 1024
# "Skip every processed entry" for READ_BATCH (any count beyond a stream's length does).
_SKIP_ALL = 2 ** 53


def counted_from(carried: tuple[str, str, int] | None, after: str) -> tuple[str, int] | None:
    """READ_BATCH's ``counted`` for a read after ``after``, from what a reader carries from its
    last read that counted without a batch, ``(offset, counted to, how many)``: its (to, how
    many) when that read started at ``after`` too, else None (count from ``after``).

    >>> counted_from(("5-0", "9-0", 4), "5-0"), counted_from(("5-0", "9-0", 4), "6-0")
    (('9-0', 4), None)
    """
    return carried[1:] if carried is not None and carried[0] == after else None


def read_batch_args(after: str, last: str, count: int, max_bytes: int, max_body: int,
                    progress: tuple[int, str] | None = None, skip_processed: bool | int = False,
                    behind_ms: int = 0, counted: tuple[str, int] | None = None) -> list:
    """ARGV for READ_BATCH: entries after ``after`` up to ``last`` ("+": no end); with
    ``progress`` (read_n, read_id) to record in the progress hash, KEYS[2]; with
    ``skip_processed``, the processed mark is the last key, and an int says how many processed
    entries one call skips at most (True: all), and ``counted`` (to, how many) goes on from what
    an earlier call from ``after`` counted; ``behind_ms``: see READ_BATCH."""
    skip = 0 if not skip_processed else _SKIP_ALL if skip_processed is True else int(skip_processed)
    to, n = counted if counted else ("", 0)
    args = [after, last, count, max_bytes, max_body, _PAGE_ENTRIES, _PAGE_BYTES, skip, int(behind_ms), to, n]
    return args + list(progress) if progress else args


def read_batch_result(reply: list) -> tuple[list[tuple[str, bytes | None, int | None]], int, str | None]:
    """READ_BATCH's reply: its (position, data, size) rows (see READ_BATCH for None), how many
    processed entries it skipped and the position it read after in their stead (None: none)."""
    skipped, skipped_to = int(reply[0]), reply[1]
    # A missing or withheld body is Lua false: None over RESP2, False over RESP3.
    rows = [
        (
            reply[i].decode(),
            reply[i + 1] if isinstance(reply[i + 1], bytes) else None,
            None if reply[i + 2] < 0 else reply[i + 2],
        )
        for i in range(2, len(reply), 3)
    ]
    return rows, skipped, skipped_to.decode() if isinstance(skipped_to, bytes) else None


def read_batch_rows(reply: list) -> list[tuple[str, bytes | None, int | None]]:
    """READ_BATCH's reply as (position, data, size) rows; see READ_BATCH for None."""
    return read_batch_result(reply)[0]


# STARTED: a marker that a guarded handler is about to run, written before it runs, fenced
# like a COMMIT and outside any step: a history's "started:<key>" (completion: external) or an
# action's "attempt:<n>" / "resubmit:<token>", each -> the time. The step that ran the handler
# removes it, so one left behind means its master died inside the handler (the next master
# loads that message In Doubt). The state version is not moved: the writer's own flow knows
# the marker, and no other copy of this state is kept warm (neither node logs its changes).
# KEYS[1] epoch key, KEYS[2] the node's state hash. ARGV[1] writer's epoch, ARGV[2] the
# marker's key, ARGV[3] its value. Returns {-1, epoch in force} when the writer is stale
# (nothing written), else {1}.
STARTED = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local mine = tonumber(ARGV[1])
if mine < cur then
  return {-1, cur}
end
if mine > cur then
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
return {1}
"""

ALL = {"raise_epoch": RAISE_EPOCH, "commit": COMMIT, "started": STARTED, "record_failure": RECORD_FAILURE,
       "record_handled": RECORD_HANDLED, "read_batch": READ_BATCH, "trim_uplink": TRIM_UPLINK,
       **audit_scripts.ALL, **stream_retention.SCRIPTS}


def register(client) -> dict:
    """The scripts bound to ``client`` (redis-py Script objects, loaded lazily by SHA)."""
    return {name: client.register_script(src) for name, src in ALL.items()}


def queue(pipe, script, keys: list, args: list) -> None:
    """Queue ``script`` (one of :func:`register`'s) on ``pipe`` by ``EVALSHA`` alone. Called with
    ``client=pipe``, redis-py would first ask ``SCRIPT EXISTS`` (a round trip more); a Redis that
    does not know the script answers ``NOSCRIPT``, and the durable write loads the scripts and
    sends the pipeline again (``durable.py``)."""
    pipe.evalsha(script.sha, len(keys), *keys, *args)
