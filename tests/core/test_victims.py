"""VictimQueue against a naive model: the run + heap split must give exactly one heap's order."""

from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.tree import Node
from radixkv.victims import VictimQueue


def make_nodes(n):
    nodes = []
    for _ in range(n):
        node = Node.__new__(Node)
        node.heap_id = 0
        nodes.append(node)
    return nodes


class Model:
    """Live entries as a dict node index -> (key, push number); the minimum by (key, push number)."""

    def __init__(self):
        self.live = {}
        self.pushes = 0

    def push(self, i, key):
        if i in self.live and self.live[i][0] == key:  # already queued at this rank: keeps its place
            return
        self.pushes += 1
        self.live[i] = (key, self.pushes)

    def top(self):
        if not self.live:
            return None
        return min(self.live, key=lambda i: self.live[i])


# clock: keys mostly rise (the run), sometimes fall back (below the head, or inside: the heap)
ops = st.lists(st.one_of(
    st.tuples(st.just("push"), st.integers(0, 11), st.integers(-3, 3), st.integers(0, 2)),
    st.tuples(st.just("discard"), st.integers(0, 11)),
    st.tuples(st.just("evict"), st.integers(0, 3)),
), max_size=120)


@settings(max_examples=200)
@given(ops)
def test_order_equals_one_heap(steps):
    q, model, nodes = VictimQueue(), Model(), make_nodes(12)
    clock = 0
    for step in steps:
        if step[0] == "push":
            _, i, delta, retention = step
            clock += 1
            key = (retention, clock + 4 * delta, 200 - i % 3)  # equal keys happen: ties by push order
            q.push(nodes[i], key)
            model.push(i, key)
        elif step[0] == "discard":
            q.discard(nodes[step[1]])
            model.live.pop(step[1], None)
        else:  # re-rank the top (a truncated leaf) or drop it (a removed one), as _evict does
            top = model.top()
            assert q.peek() is (None if top is None else nodes[top])
            if top is not None:
                if step[1]:
                    key = model.live[top][0][:2] + (model.live[top][0][2] + step[1],)
                    q.push(nodes[top], key)
                    model.push(top, key)
                else:
                    q.discard(nodes[top])
                    del model.live[top]
        top = model.top()
        assert len(q) == len(model.live)
        assert q.peek() is (None if top is None else nodes[top])
        assert q.peek_key() == (None if top is None else model.live[top][0])
        assert sorted((k, id(n)) for k, n in q.entries()) == sorted((k, id(nodes[i])) for i, (k, _) in model.live.items())


def test_orphans_are_compacted():
    q, nodes = VictimQueue(), make_nodes(4)
    for t in range(1000):  # in order and out of order, so both parts fill with orphans
        q.push(nodes[t % 4], (0, t if t % 2 else -t, 0))
    assert len(q) == 4
    assert len(q._run) + len(q._heap) <= 3 * 4 + 64
    assert {n for _, n in q.entries()} == set(nodes)


def test_in_order_pushes_skip_the_heap():
    q, nodes = VictimQueue(), make_nodes(100)
    for t, node in enumerate(nodes):
        q.push(node, (0, t, 0))
    q.push(nodes[0], (0, -1, 0))  # below the head: prepended
    assert q._heap == []
    q.push(nodes[50], (0, 10, 1))  # inside the run: the heap
    assert len(q._heap) == 1
    assert q.peek() is nodes[0]
