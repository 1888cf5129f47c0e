"""make_loader is the entry point over build_loader: its signature shows every option build_loader
takes, and a name neither knows is refused by make_loader's name."""
import inspect

import pytest

import pixfeed
from pixfeed.loaders.loader import build_loader


def test_the_signature_lists_every_option_with_its_default():
    shown = inspect.signature(pixfeed.make_loader).parameters
    built = inspect.signature(build_loader).parameters
    for name, p in built.items():
        if p.kind is inspect.Parameter.KEYWORD_ONLY:
            assert shown[name].default == p.default, name
    assert {"device", "dtype", "mean", "std", "memory_format"} <= set(shown)
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in shown.values())


def test_an_unknown_option_is_refused_by_make_loaders_name():
    with pytest.raises(TypeError, match="make_loader.* unexpected keyword argument 'shufle'"):
        pixfeed.make_loader(list(range(8)), 2, shufle=True)


def test_a_wds_plan_says_the_order_it_reads_in(image_tree, tmp_path):
    """An iterable dataset orders itself: the plan names shards shuffled and its buffer, not a full shuffle."""
    pixfeed.pack(image_tree, tmp_path / "wds", "wds", workers=1)
    shuffled = pixfeed.make_loader(pixfeed.open_dataset(tmp_path / "wds", size=16, buffer=50), 4, num_workers=0)
    reason = shuffled.pixfeed_plan.reasons["order"]
    assert "shards shuffled" in reason and "buffer of 50 samples" in reason and "full shuffle:" not in reason
    ordered = pixfeed.make_loader(pixfeed.open_dataset(tmp_path / "wds", size=16), 4, num_workers=0, shuffle=False)
    assert "shuffle=False" in ordered.pixfeed_plan.reasons["order"]
    once, again = ([int(x) for _, labels in ordered for x in labels] for _ in range(2))
    assert once == again  # the stream as stored, each epoch
