"""Every Lua script names only keys it was given in KEYS (what Redis Cluster routing relies on)."""

import re

import pytest

from twinflow.runtime.store import scripts

CALL = re.compile(r"redis\.call\('(\w+)',\s*([^,)]+)(?:,\s*([^,)]+))?")
# Commands whose first argument is a subcommand, the key following it.
CONTAINERS = ("XINFO",)


@pytest.mark.parametrize("name", sorted(scripts.ALL))
def test_every_key_a_script_touches_is_declared_in_keys(name):
    source = scripts.ALL[name]
    calls = CALL.findall(source)
    assert calls, f"{name}: no redis.call found"
    for command, first, second in calls:
        key = (second if command in CONTAINERS else first).strip()
        # `key` is the COMMIT operations' local, taken from KEYS by index.
        assert key.startswith("KEYS[") or (key == "key" and "key = ARGV[i], KEYS[" in source), \
            f"{name}: {command} on {key!r}, not a declared key"


def test_a_key_built_inside_a_script_is_caught():
    bad = "redis.call('SET', ARGV[3] .. ARGV[i], ARGV[1])"
    (command, key, _), = CALL.findall(bad)
    assert not key.startswith("KEYS[")
    (command, _, key), = CALL.findall("redis.call('XINFO', 'GROUPS', ARGV[1])")
    assert command in CONTAINERS and not key.startswith("KEYS[")
