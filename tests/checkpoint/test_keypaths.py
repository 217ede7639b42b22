"""Key-path selection: exact key paths are looked up, patterns matched, with the same result."""

import pytest

from jaxjob._src.checkpoint import keypaths


def _state(layers=12):
    layer = {"dict": [["w", {"leaf": "lw"}], ["b", {"leaf": "lb"}]]}
    return {
        "params": {"dict": [["layers", {"list": [layer] * layers}], ["head", {"leaf": "lh"}]]},
        "jaxjob/epochs_done": {"leaf": "le"},
        "opt": {"tuple": [{"leaf": "l0"}, {"dict": [[{"int": 3}, {"leaf": "l3"}]]}]},
    }


def _by_matching(state, pattern):
    """What a pattern selects when every node is matched against it (the general path)."""
    every = keypaths._every_node(state)
    found = keypaths._outermost([f for f in every if keypaths.match(keypaths.split(pattern), f)])
    return [(keypaths.join(f), *every[f]) for f in found]


def _paths(state):
    return [keypaths.join(full) for full in keypaths._every_node(state)]


def test_every_exact_key_path_selects_what_matching_selects():
    state = _state()
    for path in [*_paths(state), "params/", "/opt/1/3", "params/layers/12", "nope", ""]:
        got = [(s.key, s.name, s.segments, s.structure) for s in keypaths.select_one(state, path)]
        assert got == _by_matching(state, path), path


@pytest.mark.parametrize(
    "pattern", ["params/layers/1*/w", "**/b", "params/**", "opt/*", "params/layers/[12]/w"]
)
def test_patterns_with_wildcards_are_matched(pattern):
    state = _state()
    got = [(s.key, s.name, s.segments, s.structure) for s in keypaths.select_one(state, pattern)]
    assert got == _by_matching(state, pattern) and got


def test_exact_names_match_no_node_and_the_nodes_are_listed_once(monkeypatch):
    """250 exact names out of 1000 leaves: no per-node match (it was 250 x 1000 of them)."""
    state = {"params": {"dict": [[f"p{i:04d}", {"leaf": f"l{i}"}] for i in range(1000)]}}
    calls = {"match": 0, "every": 0}
    match, every = keypaths.match, keypaths._every_node

    def counted_match(*args):
        calls["match"] += 1
        return match(*args)

    def counted_every(*args):
        calls["every"] += 1
        return every(*args)

    monkeypatch.setattr(keypaths, "match", counted_match)
    monkeypatch.setattr(keypaths, "_every_node", counted_every)
    names = [f"params/p{i:04d}" for i in range(0, 1000, 4)]
    chosen = keypaths.select(state, names)
    assert list(chosen) == names and chosen["params/p0004"].structure == {"leaf": "l4"}
    assert calls == {"match": 0, "every": 1}


def test_an_exact_name_that_matches_nothing_names_close_key_paths():
    with pytest.raises(KeyError, match=r"'params/layers/3/x'.*match nothing.*params/layers/3/w"):
        keypaths.select(_state(), ["params/layers/3/x"], where=" here")
