"""``HubTokens`` (pool/web/identity.py) against a stand-in hub: the bounds an attacker would push
on. The whole path, through the real hub and proxy, is in test_pool_hostile.py."""

import asyncio

import pytest

from jupyter_gpushare.pool.hub import HubAPI, HubNotFound, HubUnavailable
from jupyter_gpushare.pool.web.identity import HubTokens, TooManyFailures


class StandInHub(HubAPI):
    """The hub's ``GET user``, without a hub: ``valid`` maps tokens to their owners; every
    answer takes ``delay`` seconds; ``down`` makes it unreachable. Counts its questions."""

    def __init__(self, valid=None, delay=0.0):
        super().__init__("http://stand-in.invalid/hub/api", "service-token")
        self.valid, self.delay, self.down, self.asked = dict(valid or {}), delay, False, 0

    async def get(self, path, token=None):
        assert path == "user"
        self.asked += 1
        await asyncio.sleep(self.delay)
        if self.down:
            raise HubUnavailable("the stand-in hub is down")
        if token not in self.valid:
            raise HubNotFound("no such token")
        return {"kind": "user", "name": self.valid[token], "scopes": []}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def run(coro):
    return asyncio.run(coro)


def test_new_tokens_are_counted_from_the_moment_they_ask():
    """1,000 strangers at once against a line of 10: the rest are refused at once (before,
    a waiting token counted only once its question had started, and none was refused)."""
    hub = StandInHub(delay=0.05)
    tokens = HubTokens(hub, waiting=10, concurrent=2)

    async def flood():
        return await asyncio.gather(*[tokens.identify(f"random-{i}", client=f"10.0.0.{i % 200}")
                                      for i in range(1000)], return_exceptions=True)

    answers = run(flood())
    refused = [a for a in answers if isinstance(a, TooManyFailures)]
    assert len(refused) == 990 and answers.count(None) == 10 and hub.asked == 10


def test_one_client_takes_a_quarter_of_the_line_at_most():
    hub = StandInHub({"alices": "alice"}, delay=0.05)
    tokens = HubTokens(hub, waiting=40, concurrent=4)

    async def go():
        flood = [asyncio.ensure_future(tokens.identify(f"random-{i}", client="203.0.113.9"))
                 for i in range(100)]
        await asyncio.sleep(0)
        mine = await tokens.identify("alices", client="198.51.100.7")
        return mine, await asyncio.gather(*flood, return_exceptions=True)

    mine, answers = run(go())
    assert mine["name"] == "alice"
    refused = [a for a in answers if isinstance(a, TooManyFailures)]
    assert len(refused) == 90 and "from your address" in str(refused[0])


def test_one_owner_keeps_a_bounded_number_of_confirmed_tokens():
    """A user who makes many tokens pushes out her own oldest, not other users' tokens."""
    valid = {f"mallory-{i}": "mallory" for i in range(50)} | {"alices": "alice"}
    hub = StandInHub(valid)
    tokens = HubTokens(hub, size=30, per_owner=8)

    async def go():
        await tokens.identify("alices")
        for i in range(50):
            await tokens.identify(f"mallory-{i}")
        asked = hub.asked
        await tokens.identify("alices")
        return hub.asked - asked

    assert run(go()) == 0  # alice's answer was kept
    assert len(tokens) == 9


def test_a_revoked_token_is_refused_once_its_answer_expired():
    clock = Clock()
    hub = StandInHub({"alices": "alice"})
    tokens = HubTokens(hub, ttl_s=60, clock=clock)

    async def go():
        assert (await tokens.identify("alices"))["name"] == "alice"
        del hub.valid["alices"]
        clock.now += 59
        fresh = await tokens.identify("alices")
        clock.now += 2
        return fresh, await tokens.identify("alices")

    fresh, expired = run(go())
    assert fresh["name"] == "alice" and expired is None


@pytest.mark.parametrize("hub_state", ["slow", "down"])
def test_an_expired_answer_is_used_while_the_hub_is_slow_or_down_for_one_ttl_more(hub_state):
    clock = Clock()
    hub = StandInHub({"alices": "alice"})
    tokens = HubTokens(hub, ttl_s=60, recheck_wait_s=0.05, clock=clock)

    async def go():
        await tokens.identify("alices")
        hub.delay, hub.down = (0.5, False) if hub_state == "slow" else (0.0, True)
        clock.now += 90
        stale = await tokens.identify("alices")
        clock.now += 40  # twice the ttl: no old answer is used any more
        try:
            return stale, await tokens.identify("alices")
        except HubUnavailable as e:
            return stale, e

    stale, later = run(go())
    assert stale["name"] == "alice"
    if hub_state == "slow":
        assert later["name"] == "alice"  # waited for the hub's answer
    else:
        assert isinstance(later, HubUnavailable)


def test_an_unknown_token_is_refused_without_asking_again_for_a_ttl():
    clock = Clock()
    hub = StandInHub()
    tokens = HubTokens(hub, ttl_s=60, clock=clock)

    async def go():
        for _ in range(5):
            assert await tokens.identify("random") is None
        clock.now += 61
        assert await tokens.identify("random") is None

    run(go())
    assert hub.asked == 2
