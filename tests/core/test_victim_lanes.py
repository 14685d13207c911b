"""LaneQueue against a model: the head is the policy's choice among the lanes' heads of the lowest retention class."""

from hypothesis import given
from hypothesis import strategies as st

from radixkv.victims import LaneQueue

from .test_victims import make_nodes


class _Chooser:
    """A policy stand-in: lane and score per node, set by the test; ``choose`` takes the lowest score."""

    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        self.lane_of: dict = {}
        self.score: dict = {}

    def lane(self, node):
        return self.lane_of[node]

    def choose(self, heads):
        return min(range(len(heads)), key=lambda i: (self.score[heads[i]], self.lane_of[heads[i]]))


ops = st.lists(st.one_of(
    st.tuples(st.just("push"), st.integers(0, 9), st.integers(0, 2), st.integers(0, 1), st.integers(-3, 3)),
    st.tuples(st.just("discard"), st.integers(0, 9)),
    st.tuples(st.just("score"), st.integers(0, 9), st.integers(0, 5)),
), max_size=80)


@given(ops)
def test_lane_queue_head_is_the_choice_among_lane_heads(steps):
    policy, nodes = _Chooser(3), make_nodes(10)
    q = LaneQueue(policy)
    live: dict = {}  # node index -> (key, lane, push number)
    pushes = 0
    for i in range(10):
        policy.score[nodes[i]] = 0
    for step in steps:
        if step[0] == "push":
            _, i, lane, retention, delta = step
            pushes += 1
            key = (retention, pushes + 4 * delta, 0)
            policy.lane_of[nodes[i]] = lane
            q.push(nodes[i], key)
            if not (i in live and live[i][:2] == (key, lane)):
                live[i] = (key, lane, pushes)
        elif step[0] == "discard":
            q.discard(nodes[step[1]])
            live.pop(step[1], None)
        else:
            policy.score[nodes[step[1]]] = step[2]
        heads = {}
        for i, (key, lane, n) in live.items():
            if lane not in heads or (key, n) < heads[lane][:2]:
                heads[lane] = (key, n, i)
        expected = None
        if heads:
            lowest = min(h[0][0] for h in heads.values())
            cands = [heads[lane][2] for lane in sorted(heads) if heads[lane][0][0] == lowest]
            expected = min(cands, key=lambda i: (policy.score[nodes[i]], live[i][1]))
        assert len(q) == len(live)
        assert q.peek() is (None if expected is None else nodes[expected])
        assert q.peek_key() == (None if expected is None else live[expected][0])
        assert sorted((k, id(n)) for k, n in q.entries()) == sorted((k, id(nodes[i])) for i, (k, _, _) in live.items())
