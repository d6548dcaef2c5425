"""pipeline/inputs/embodiments.py's rules on their own: how a selection is parsed, and how its tags become slot ids, with
the built-in tables held to the ids Isaac-GR00T's own code gives (../shared/reference/gr00t-checkpoints.md 2.x,
3.5, 4.5), a trainer's map, LeRobot's slot for a tag outside its map, and the one sentence for each refusal."""

from __future__ import annotations

import pytest

from pipeline.inputs.embodiments import Embodiments, TagMap
from pipeline.model.versions import load_config
from tasks.errors import CacheError, ConfigError

# The reference's tables, copied by hand (not read from configs/): N1.5's embodiment_tags, N1.6's
# EMBODIMENT_TAG_TO_PROJECTOR_INDEX, N1.7's posttrain ids.
ISAAC_IDS = {
    "n15": {"new_embodiment": 31, "oxe_droid": 17, "agibot_genie1": 26, "gr1": 24},
    "n16": {"oxe_google": 0, "oxe_widowx": 1, "libero_panda": 2, "unitree_g1": 8, "new_embodiment": 10,
            "robocasa_panda_omron": 13, "gr1": 20, "behavior_r1_pro": 24},
    "n17": {"simpler_env_google": 0, "simpler_env_widowx": 1, "libero_sim": 2, "new_embodiment": 10,
            "unitree_g1_sonic": 11},
}


@pytest.mark.parametrize("version", sorted(ISAAC_IDS))
def test_each_tag_is_the_slot_isaac_gr00t_gives_it(version):
    cfg = load_config(version)
    for tag, slot in ISAAC_IDS[version].items():
        assert Embodiments.parse(tag).slots(cfg) == (slot,), tag
    assert Embodiments.parse(",".join(ISAAC_IDS[version])).slots(cfg) == tuple(sorted(set(ISAAC_IDS[version].values())))


def test_a_selection_is_every_slot_tags_or_ids_parsed_once():
    cfg = load_config("n16")
    assert Embodiments.parse(None).every and Embodiments.parse("all").every and str(Embodiments.parse(None)) == "all"
    assert Embodiments.parse(" gr1 , 3 ").items == ("gr1", "3")
    assert Embodiments.parse(7).slots(cfg) == (7,)
    assert Embodiments.parse("all").slots(cfg) == tuple(range(32))
    assert Embodiments.parse("all").slots(cfg, bank_slots=2) == (0, 1)  # a synthetic attn bank of two
    assert Embodiments.parse("gr1,20,gr1").slots(cfg) == (20,)  # sorted, unique
    parsed = Embodiments.parse("gr1")
    assert Embodiments.parse(parsed) is parsed
    with pytest.raises(ConfigError, match="no embodiment selected"):
        Embodiments.parse(" ")


def test_a_trainers_map_wins_and_lerobot_trains_a_tag_outside_its_map_as_slot_0():
    cfg = load_config("n17")
    theirs = TagMap({"new_embodiment": 10, "my_robot": 5}, "run/policy_preprocessor.json", unknown_slot=0)
    assert Embodiments.parse("my_robot").slots(cfg, tags=theirs) == (5,)
    assert Embodiments.parse("unitree_g1_sonic").slots(cfg, tags=theirs) == (0,)  # Isaac-GR00T's 11 is not it
    assert Embodiments.parse("unitree_g1_sonic,my_robot").outside(theirs) == ("unitree_g1_sonic",)
    isaac = TagMap({"new_embodiment": 10}, "checkpoint-1000/embodiment_id.json")
    with pytest.raises(ConfigError, match=r"unknown embodiment tag 'my_robot' for n17 \(checkpoint-1000/"
                                          r"embodiment_id.json knows: new_embodiment\)"):
        Embodiments.parse("my_robot").slots(cfg, tags=isaac)


def test_trained_is_replaced_by_the_recorded_tags_or_refused_in_the_given_sentence():
    chosen = Embodiments.parse("trained,3").with_trained(("gr1", "unitree_g1"), "unused")
    assert chosen.items == ("gr1", "unitree_g1", "3") and chosen.slots(load_config("n16")) == (3, 8, 20)
    assert Embodiments.parse("gr1").with_trained(None, "unused").items == ("gr1",)
    with pytest.raises(ConfigError, match="^records none here$"):
        Embodiments.parse("trained").with_trained(None, "records none here")


def test_out_of_range_one_and_among_say_what_to_pass():
    cfg = load_config("n16")
    with pytest.raises(ConfigError, match=r"embodiment slot 32 is out of range .* slots 0\.\.31"):
        Embodiments.parse("32").slots(cfg)
    with pytest.raises(ConfigError, match=r"embodiment gr1 \(slot 20, as configs/n16\.toml maps it\) is out of range .* slots 0\.\.1; pass a slot id 0\.\.1$"):
        Embodiments.parse("gr1").slots(cfg, bank_slots=2)
    assert Embodiments.parse("gr1").one(cfg, "load") == 20 and Embodiments.parse("all").one(cfg, "load") is None
    with pytest.raises(ConfigError, match=r"load takes one embodiment .* not 'gr1,3': slots \[3, 20\]"):
        Embodiments.parse("gr1,3").one(cfg, "load")
    assert Embodiments.parse("all").among(cfg, (3, 20), "E") == (3, 20)
    with pytest.raises(CacheError, match=r"^E: embodiment slot\(s\) \[10\] were not converted .* --embodiments 10,20 or all"):
        Embodiments.parse("new_embodiment,gr1").among(cfg, (3, 20), "E")
    assert Embodiments.parse("gr1").one_tag() == "gr1" and Embodiments.parse("20").one_tag() is None
