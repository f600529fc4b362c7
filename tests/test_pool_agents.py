"""Which node a reading may speak for (pool/utilization/node_agents.py), without a cluster: what a
TokenReview and the agent's pod must say, and each agent's refusal in one sentence. The same checks
against a real API server: tests/test_agent_kube.py."""

import asyncio

import pytest

from jupyter_gpushare.pool.utilization.node_agents import (AUDIENCE, AgentNodes, NotProven,
                                                           PodTokens, Unverifiable, node_of_pod,
                                                           pod_of_review)

NS, ACCOUNT = "jhub", "gpushare-agent"


def review(username=f"system:serviceaccount:{NS}:{ACCOUNT}", audiences=(AUDIENCE,),
           pod=("gpushare-agent-x1", "uid-1"), authenticated=True):
    extra = {} if pod is None else {"authentication.kubernetes.io/pod-name": [pod[0]],
                                    "authentication.kubernetes.io/pod-uid": [pod[1]]}
    return {"authenticated": authenticated, "audiences": list(audiences),
            "user": {"username": username, "extra": extra}}


def test_a_review_of_the_agents_pod_token_names_its_pod():
    assert pod_of_review(review(), NS, ACCOUNT) == ("gpushare-agent-x1", "uid-1")


@pytest.mark.parametrize("status, words", [
    ({"error": "invalid bearer token"}, "does not accept the agent's pod token"),
    (review(authenticated=False), "does not accept"),
    (review(audiences=("https://kubernetes.default.svc",)), "does not accept"),
    (review(username=f"system:serviceaccount:{NS}:default"), "not the agent's service account"),
    (review(username=f"system:serviceaccount:other:{ACCOUNT}"), "not the agent's service"),
    (review(username="admin"), "not the agent's service account"),
    (review(pod=None), "not bound to a pod"),
], ids=["error", "unauthenticated", "audience", "account", "namespace", "user", "unbound"])
def test_a_review_that_does_not_vouch_for_an_agent_pod_is_refused(status, words):
    with pytest.raises(NotProven, match=words):
        pod_of_review(status, NS, ACCOUNT)


def pod(uid="uid-1", node="x1", deleting=False):
    meta = {"name": "gpushare-agent-x1", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-20T09:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}}


def test_the_node_is_the_pods():
    assert node_of_pod(pod(), "gpushare-agent-x1", "uid-1") == "x1"


@pytest.mark.parametrize("found, words", [
    (None, "no longer exists"), (pod(uid="uid-2"), "no longer exists"),
    (pod(deleting=True), "no longer exists"), (pod(node=""), "not on a node yet"),
], ids=["gone", "another-of-that-name", "being-deleted", "unscheduled"])
def test_a_pod_that_is_not_the_tokens_is_refused(found, words):
    with pytest.raises(NotProven, match=words):
        node_of_pod(found, "gpushare-agent-x1", "uid-1")


class OnNode(PodTokens):
    """Kubernetes says every pod token is of a pod on ``node``."""

    def __init__(self, node):
        super().__init__(None, NS, ACCOUNT)
        self.on, self.asked = node, 0

    async def _ask(self, token):
        self.asked += 1
        return self.on


JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"  # shaped like one; nothing checks it here


class Refusing(OnNode):
    """Kubernetes refuses every token, slowly."""

    async def _ask(self, token):
        self.asked += 1
        await asyncio.sleep(0.05)
        raise NotProven("the pod token is 'system:anonymous''s")


def test_junk_in_the_token_header_is_refused_without_asking_kubernetes():
    pods = OnNode("x1")
    for junk in ("t", "a.b", "a.b.c.d", "a b.c.d", JWT + "x" * PodTokens.MAX_TOKEN):
        with pytest.raises(NotProven, match="is not a service-account token"):
            asyncio.run(pods.node(junk))
    assert pods.asked == 0


def test_a_compromised_node_cannot_make_the_pool_flood_kubernetes():
    """The shared agent token is on every node: its holder's junk tokens cost one question
    each, shared by concurrent askers, remembered when refused, and bounded in number."""
    pods = Refusing("x1")
    pods.waiting = 10

    async def flood():
        same = [pods.node(JWT) for _ in range(50)]
        many = [pods.node(f"{JWT}{i}") for i in range(100)]
        return await asyncio.gather(*same, *many, return_exceptions=True)

    answers = asyncio.run(flood())
    assert all(isinstance(a, NotProven) for a in answers[:50])
    busy = [a for a in answers[50:] if isinstance(a, Unverifiable)]
    assert len(busy) >= 90 and "too many agent tokens" in str(busy[0])
    assert pods.asked <= 10
    asked = pods.asked
    with pytest.raises(NotProven, match="system:anonymous"):
        asyncio.run(pods.node(JWT))  # the refusal is remembered
    assert pods.asked == asked


def check(agents, service, node, token=None):
    asyncio.run(agents.check(service, node, token))


def test_each_agent_speaks_for_its_node_only():
    pods = OnNode("x1")
    agents = AgentNodes("gpushare-agent", {"agent-x2": "x2"}, pods)
    assert agents.is_agent("gpushare-agent") and agents.is_agent("agent-x2")
    assert not agents.is_agent("gpushare-spawner")
    check(agents, "agent-x2", "x2")
    with pytest.raises(NotProven, match=r"^the agent service 'agent-x2' speaks only for node "
                                        r"x2, not for x1$"):
        check(agents, "agent-x2", "x1")
    check(agents, "gpushare-agent", "x1", JWT)
    with pytest.raises(NotProven, match=r"^this agent's pod runs on node x1, not on x2$"):
        check(agents, "gpushare-agent", "x2", JWT)
    with pytest.raises(NotProven, match="must carry its pod's service-account token"):
        check(agents, "gpushare-agent", "x1")
    assert pods.asked == 1  # the answer for a token is kept


def test_without_kubernetes_the_shared_agent_proves_no_node():
    agents = AgentNodes("gpushare-agent", {}, None)
    with pytest.raises(NotProven, match=r"does not prove which node .*c\.GPUUsage\.agent_nodes"):
        check(agents, "gpushare-agent", "x1", "t")
