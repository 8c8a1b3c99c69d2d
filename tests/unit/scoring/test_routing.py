"""Routes by ``data_source`` (``scoring/routing.py``): the first route whose patterns match, each ``data_source``'s
route kept, an unrouted one named with the patterns; compositions shared between routes; the members' scales
ensembled into one value, per attribute when every member weighs the same attributes. No server: the reward models
are built from their options (nothing is asked of their URL), and their scales are given as numbers."""

from __future__ import annotations

import pytest

from verl_vllm_rm.scoring.options import parse_options
from verl_vllm_rm.scoring.reward_model import RewardModel
from verl_vllm_rm.scoring.routing import Router, UnroutedDataSourceError, shared_attributes

ATTRIBUTES = {"helpfulness": 1.0, "verbosity": -0.5}


def router_of(raw: dict, tokenizer=None) -> Router:
    options = parse_options({"server_url": "http://127.0.0.1:1", **raw})
    return Router(options, tokenizer, {o.name: RewardModel(o, tokenizer, coalesce_s=0.0) for o in options.rm_options})


def models(*entries: dict) -> list[RewardModel]:
    options = parse_options({"server_url": "http://127.0.0.1:1", "reward_models": list(entries)})
    return [RewardModel(o, None, coalesce_s=0.0) for o in options.rm_options]


def test_the_first_route_whose_patterns_match_decides_and_is_kept():
    router = router_of({"reward_models": [{"name": "math"}, {"name": "chat"}],
                        "routes": [{"data_source": ["gsm8k", "math/*"], "reward_models": ["math"]},
                                   {"data_source": ["math/hard"], "reward_models": ["chat"]},
                                   {"data_source": ["*"], "reward_models": ["chat"]}]})
    first, _, rest = router.routes
    assert router.route("gsm8k") is first and router.route("math/hard") is first  # listed first wins
    assert router.route("Math/easy") is rest  # patterns are case-sensitive
    assert router.route("") is rest
    assert [rm.name for rm in router.route("math/x").members] == ["math"]
    assert router.route("gsm8k") is first  # found once, then kept


def test_a_data_source_no_route_matches_is_named_with_the_patterns():
    router = router_of({"routes": [{"data_source": ["gsm8k", "math/*"]}]})
    with pytest.raises(UnroutedDataSourceError,
                       match=r"^data_source 'chat/v2' matches no route of reward_kwargs\.routes \(data_source "
                             r"patterns: \[\['gsm8k', 'math/\*'\]\]\); add a route for it, or a last route with "
                             r"data_source \['\*'\]$") as err:
        router.route("chat/v2")
    assert isinstance(err.value, KeyError)  # a KeyError whose message is not quoted


def test_routes_with_equal_compositions_share_one():
    router = router_of({"reward_models": [{"name": "a"}, {"name": "b"}],
                        "routes": [{"data_source": ["x"], "reward_models": ["a"]},
                                   {"data_source": ["y"], "reward_models": ["b"]},
                                   {"data_source": ["z"], "rewards": {"components": ["rubric", "format"]}},
                                   {"data_source": ["*"], "rewards": {"components": ["rubric", "format"]}}]})
    x, y, z, rest = router.routes
    assert x.composition is y.composition and z.composition is rest.composition
    assert x.composition is not z.composition
    assert router.compositions == [x.composition, z.composition]
    assert [len(r.members) for r in router.routes] == [1, 1, 2, 2]  # a route without reward_models: every RM


@pytest.mark.parametrize(("raw", "where"), [
    ({"rewards": {"components": ["gallery:no_such_reward"]}, "routes": [{"data_source": ["*"], "reward_models": []}]},
     "rewards"),
    ({"routes": [{"data_source": ["x"]},
                 {"data_source": ["*"], "reward_models": [], "rewards": {"components": ["gallery:no_such_reward"]}}]},
     r"routes\[1\]\.rewards"),
])
def test_a_composition_that_cannot_be_built_is_named_by_its_place_in_reward_kwargs(raw, where):
    with pytest.raises(ValueError, match=rf"^reward_kwargs\.{where}: unknown rm-gallery reward 'no_such_reward'"):
        router_of(raw)


def test_a_route_is_token_level_when_its_rm_places_step_rewards_on_tokens():
    router = router_of({"reward_models": [{"name": "prm", "step_reward": "token"}, {"name": "orm"}],
                        "routes": [{"data_source": ["math"], "reward_models": ["prm"]},
                                   {"data_source": ["*"], "reward_models": ["orm"]}]})
    assert [r.token_level for r in router.routes] == [True, False]


def test_one_member_present_is_its_own_ensemble_whatever_the_method():
    router = router_of({"reward_models": [{"name": "a"}, {"name": "b"}],
                        "routes": [{"data_source": ["*"], "ensemble": "mean_minus_std"}]})
    route = router.routes[0]
    assert route.ensemble == "mean_minus_std"
    assert route.combine([None, (2.5, None)]) == (2.5, 0.0, None)  # a masked member is left out


@pytest.mark.parametrize(("method", "value"), [("mean", 2.0), ("min", 1.0), ("median", 2.0),
                                               ("mean_minus_std", 2.0 - 0.5 * 1.0)])
def test_members_scales_are_ensembled_by_the_routes_method(method, value):
    router = router_of({"reward_models": [{"name": "a"}, {"name": "b"}],
                        "routes": [{"data_source": ["*"], "ensemble": method, "uncertainty_penalty": 0.5}]})
    assert router.routes[0].combine([(1.0, None), (3.0, None)]) == (value, 1.0, None)  # std 1: population std


def test_a_routes_members_with_the_same_attributes_are_combined_attribute_by_attribute():
    router = router_of({"reward_models": [{"name": "a", "attributes": ATTRIBUTES},
                                          {"name": "b", "attributes": dict(reversed(ATTRIBUTES.items()))}]})
    route = router.routes[0]
    assert route.attributes == {"helpfulness": 1.0, "verbosity": -0.5}
    assert router.ensembled_attributes == ["helpfulness", "verbosity"]
    # each member's attribute values in the route's order (helpfulness, verbosity); the first number is not read
    value, std, (by_attribute, attribute_std) = route.combine([(9.0, [1.0, 2.0]), (9.0, [3.0, 2.0])])
    assert by_attribute.tolist() == [2.0, 2.0] and attribute_std.tolist() == [1.0, 0.0]
    assert value == 1.0 * 2.0 - 0.5 * 2.0
    assert std == 1.0  # of the members' weighted sums, 0.0 and 2.0
    value, std, (by_attribute, attribute_std) = route.combine([None, (9.0, [3.0, 2.0])])  # a masked member
    assert (value, std, by_attribute.tolist(), attribute_std.tolist()) == (2.0, 0.0, [3.0, 2.0], [0.0, 0.0])


def test_only_members_that_all_weigh_the_same_attributes_share_them():
    same = models({"name": "a", "attributes": ATTRIBUTES}, {"name": "b", "attributes": {"verbosity": -0.5,
                                                                                        "helpfulness": 1.0}})
    assert shared_attributes(same) == {"helpfulness": 1.0, "verbosity": -0.5}  # by name, whatever the order given
    assert shared_attributes(same[:1]) is None  # one RM: its weighted sum is its reward
    other_weight = models({"name": "a", "attributes": ATTRIBUTES},
                          {"name": "b", "attributes": {"helpfulness": 1.0, "verbosity": -0.25}})
    assert shared_attributes(other_weight) is None
    scalar = models({"name": "a", "attributes": ATTRIBUTES}, {"name": "b"})
    assert shared_attributes(scalar) is None
    assert shared_attributes(models({"name": "a"}, {"name": "b"})) is None
    router = router_of({"reward_models": [{"name": "a", "attributes": ATTRIBUTES}, {"name": "b"}]})
    assert router.routes[0].attributes is None and router.ensembled_attributes == []
