"""The retention of the streams a flow writes: each trimmed to its bounds, counting what no
consumer group had read.

The master trims each stream the flow writes (its sinks, its ``out:<node>:<outlink>`` streams,
``failure`` and ``notices``; ``runtime/stream_spec.py``) in its trim round, to at most
``max_entries`` entries and to none older than ``retention`` on the flow's clock, with one
TRIM_STREAM script per stream, all of a round's in one round trip. Before it removes anything,
the script finds the smallest ``last-delivered-id`` of the stream's consumer groups (``XINFO
GROUPS``): every entry it removes after that point is one some group never read, and is added
to the stream's count in ``tf:{F}:streams:unread`` (every entry removed, to
``tf:{F}:streams:trimmed``), in the same script. A stream with no consumer group has no reader
the flow can know of (a reader by ID, ``XREAD``, records nothing in Redis): it is trimmed all
the same, and nothing is counted as unread.

How many removed entries are unread is counted without reading them where Redis knows it: the
age bound removes the read entries first (``XTRIM MINID`` just past that ID), then the unread
ones, and each ``XTRIM`` says how many it removed; the count bound uses the group's ``lag``
(entries not yet delivered to it). When Redis cannot tell the lag (a group set to an arbitrary
ID, or entries deleted after it), the script counts the read entries by paging through them, at
most ``budget`` per call, and a call that stops there says ``more``.

Under failure: a script is all or nothing, and a retry after a lost reply trims and counts only
what is still there, so nothing is counted twice. Redis unreachable raises (``RedisUnavailable``
after the call's deadline); the caller waits for its next round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from ..stream_spec import Retention
    from .flow_store import FlowStore

SCAN_BUDGET = 5_000  # read entries one call pages through at most when Redis cannot tell a group's lag
SCAN_PAGE = 64       # entries per XRANGE page of that count (their bodies are copied into the script)

# TRIM_STREAM: trim one stream to its bounds, counting what was removed and, of it, what lies
# after the smallest last-delivered-id of the stream's consumer groups (see the module doc).
# KEYS[1] the stream, KEYS[2] the removed counts (hash: stream name -> entries), KEYS[3] the
# unread counts (the same).
# ARGV[1] the stream's name (the hashes' field), ARGV[2] the age cut-off ("<ms>-0": entries
# before it go; "" none), ARGV[3] max entries ("" none), ARGV[4] the most read entries one call
# pages through (SCAN_BUDGET), ARGV[5] entries per page.
# Returns {removed, of them unread, 1 when more are due (else 0), 1 when the stream has a
# consumer group (else 0), entries kept, removed in all, unread in all}.
TRIM_STREAM = """
local function parts(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function before(a, b)
  local ams, aseq = parts(a)
  local bms, bseq = parts(b)
  if ams ~= bms then return ams < bms end
  return aseq < bseq
end
local function just_after(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  if tonumber(seq) < 9007199254740991 then return ms .. '-' .. string.format('%d', tonumber(seq) + 1) end
  return string.format('%d', tonumber(ms) + 1) .. '-0'
end
local cutoff, max, budget, page = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local removed, unread, more, grouped = 0, 0, 0, 0
if redis.call('XLEN', KEYS[1]) > 0 then
  local low, lag = nil, nil
  for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
    local id, behind = nil, nil
    for i = 1, #group, 2 do
      if group[i] == 'last-delivered-id' then id = group[i + 1] end
      if group[i] == 'lag' then behind = group[i + 1] end
    end
    if low == nil or before(id, low) then
      low, lag = id, behind
    elseif id == low and not lag then
      lag = behind
    end
  end
  if low then grouped = 1 end
  if cutoff ~= '' then
    if low and before(low, cutoff) then
      removed = redis.call('XTRIM', KEYS[1], 'MINID', just_after(low))
      unread = redis.call('XTRIM', KEYS[1], 'MINID', cutoff)
      removed = removed + unread
    else
      removed = redis.call('XTRIM', KEYS[1], 'MINID', cutoff)
    end
  end
  local len = redis.call('XLEN', KEYS[1])
  if max and len > max then
    local over = len - max
    local read = over  -- no consumer group: nothing counts as unread
    if low then
      local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)[1][1]
      if before(low, first) then
        read = 0
      elseif lag then
        read = len - math.min(tonumber(lag), len)
      else
        local want, seen, from, last = math.min(over, budget), 0, '-', nil
        while seen < want do
          local n = math.min(page, want - seen)
          local entries = redis.call('XRANGE', KEYS[1], from, low, 'COUNT', n)
          seen = seen + #entries
          if #entries > 0 then
            last = entries[#entries][1]
            from = '(' .. last
          end
          if #entries < n then break end
        end
        if seen == want and want < over then  -- the budget ends before the read entries do
          removed = removed + redis.call('XTRIM', KEYS[1], 'MINID', just_after(last))
          more, read = 1, nil
        else
          read = seen
        end
      end
    end
    if read and read >= over then
      removed = removed + redis.call('XTRIM', KEYS[1], 'MAXLEN', max)
    elseif read then
      if read > 0 then
        removed = removed + redis.call('XTRIM', KEYS[1], 'MINID', just_after(low))
      end
      local gone = redis.call('XTRIM', KEYS[1], 'MAXLEN', max)
      removed, unread = removed + gone, unread + gone
    end
  end
end
if removed > 0 then redis.call('HINCRBY', KEYS[2], ARGV[1], removed) end
if unread > 0 then redis.call('HINCRBY', KEYS[3], ARGV[1], unread) end
return {removed, unread, more, grouped, redis.call('XLEN', KEYS[1]),
        tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0'), tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')}
"""

SCRIPTS = {"trim_stream": TRIM_STREAM}


@dataclass(frozen=True)
class StreamTrim:
    """What one TRIM_STREAM call did to a stream, and its counts in Redis afterwards."""

    stream: str
    removed: int          # entries this call removed
    unread: int           # of them, after the smallest last-delivered-id of the stream's groups
    more: bool            # the call stopped at its budget: another is due
    grouped: bool         # the stream has a consumer group
    entries: int          # entries kept
    removed_total: int    # every entry the retention removed from this stream so far
    unread_total: int     # of them, unread


def cutoff_id(retention_s: float | None, now_s: float) -> str:
    """The age cut-off as a stream ID: entries before it are older than ``retention_s`` at
    ``now_s`` ("" when there is no age bound).

    >>> cutoff_id(60, 1000.5), cutoff_id(None, 1000.5)
    ('940500-0', '')
    """
    return "" if retention_s is None else f"{max(0, int((now_s - retention_s) * 1000))}-0"


def trim_streams(store: "FlowStore", bounds: Iterable[tuple[str, "Retention"]], now_s: float,
                 budget: int = SCAN_BUDGET, deadline_s: float | None = 0) -> list[StreamTrim]:
    """Trim each (stream name, its bounds) of the flow at ``now_s`` (the flow's time), all in one
    round trip; one :class:`StreamTrim` per stream, in order."""
    keys = store.keys
    plans = [(name, b) for name, b in bounds]
    if not plans:
        return []

    def run():
        pipe = store.r.pipeline(transaction=False)
        for name, b in plans:
            store.scripts["trim_stream"](
                keys=[keys.stream(name), keys.streams_trimmed, keys.streams_unread],
                args=[name, cutoff_id(b.retention, now_s), "" if b.max_entries is None else b.max_entries,
                      budget, SCAN_PAGE], client=pipe)
        return pipe.execute()

    replies = store.call("trim the flow's streams", run, deadline_s)
    return [StreamTrim(name, *(int(x) for x in reply[:2]), bool(reply[2]), bool(reply[3]),
                       *(int(x) for x in reply[4:]))
            for (name, _), reply in zip(plans, replies)]

