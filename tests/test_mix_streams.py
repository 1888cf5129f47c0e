"""pixfeed.mix of WebDataset packs (a StreamMixture): their streams interleaved with exact quotas per epoch, split
by rank and worker as one pack is, resumed mid-epoch, and refused beside map-style sources."""
from __future__ import annotations

import hashlib
import shutil
import tarfile
import json
from collections import Counter

import pytest
from torch.utils.data import IterableDataset

import pixfeed
from conftest import make_tree
from pixfeed.datasets import open_dataset
from pixfeed.errors import MixtureError
from pixfeed.loaders import make_loader
from pixfeed.mixing import StreamMixture
from pixfeed.mixing import file as mixture_file
from pixfeed.packers import pack
from test_mix import BATCH, SEED, Rank


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    """Two packs of stored pixels in several shards: 12 records in shards of 5 (cat, dog, eel), 6 in shards of 2
    (fox, dog)."""
    root = tmp_path_factory.mktemp("mixstreams")
    pack(make_tree(root / "s1", per_class=4), root / "a", "wds", store="pixels", size=8, workers=1, shard_size=5)
    pack(make_tree(root / "s2", classes=("fox", "dog"), per_class=3), root / "b", "wds", store="pixels", size=8,
         workers=1, shard_size=2)
    return root


def ident(image, label, source) -> tuple:
    """(source, label, digest of the pixels): one record of one source (each pack's images differ)."""
    return int(source), int(label), hashlib.sha1(image.numpy().tobytes()).hexdigest()


def everything(mixture) -> set:
    """Every record of every source of ``mixture``, as ``ident`` names them (each source read alone, in order)."""
    out = set()
    for s, (ds, table) in enumerate(zip(mixture.sources, mixture._tables)):
        alone = pixfeed.open_dataset(ds.path, shuffle=False, rank=0, world_size=1)
        out |= {ident(image, label if table is None else table[label], s) for image, label in alone}
    assert len(out) == sum(mixture.lengths)
    return out


def epoch(loader) -> list:
    return [ident(*sample) for batch in loader for sample in zip(*batch)]


def mixed(packs, **options):
    return pixfeed.mix([open_dataset(packs / "a"), open_dataset(packs / "b")], with_source=True, **options)


def test_wds_packs_mix_as_a_stream_with_exact_quotas_every_epoch(packs):
    mixture = mixed(packs, weights=[1, 3], epoch_size=30)  # source b: 22 samples of its 6 records, 3.67 passes
    assert isinstance(mixture, StreamMixture) and isinstance(mixture, IterableDataset)
    assert mixture.quotas == [8, 22] and mixture.classes == ["cat", "dog", "eel", "fox"]
    records = everything(mixture)
    loader = make_loader(mixture, BATCH, seed=SEED, num_workers=0)
    epochs = []
    for _ in range(3):
        seen = epoch(loader)
        assert Counter(s for s, _, _ in seen) == {0: 8, 1: 22}  # a quota per source, met exactly
        assert set(seen) <= records
        counts = Counter(seen)  # source b read over and over: every record 3 or 4 times, none more
        assert sorted({counts[r] for r in records if r[0] == 1}) == [3, 4]
        assert max(counts[r] for r in records if r[0] == 0) == 1  # a share of a source: no record twice
        epochs.append(seen)
    assert epochs[0] != epochs[1]
    again = make_loader(mixed(packs, weights=[1, 3], epoch_size=30), BATCH, seed=SEED, num_workers=0)
    assert epoch(again) == epochs[0]  # a function of (seed, epoch)


@pytest.mark.parametrize("world,workers", [(1, 0), (2, 0), (2, 2)])
def test_every_sample_of_every_pack_once_an_epoch_on_any_number_of_ranks_and_workers(packs, monkeypatch, world,
                                                                                     workers):
    mixture = mixed(packs)  # 18 samples: 9 a rank on 2 ranks
    records = everything(mixture)
    ranks = [Rank(monkeypatch, mixture, rank, world, num_workers=workers) for rank in range(world)]
    per_rank = [r.run(lambda loader: [b for b in loader], r.loader) for r in ranks]
    for r, batches in zip(ranks, per_rank):  # as many batches as len(loader) says, on every rank
        assert len(batches) == r.run(len, r.loader) == -(-18 // world // BATCH)
    seen = [ident(*sample) for batches in per_rank for batch in batches for sample in zip(*batch)]
    assert sorted(seen) == sorted(records)  # disjoint, and the whole epoch


def test_a_resume_mid_epoch_reads_exactly_the_rest(packs):
    def make():
        return make_loader(mixed(packs, repeats=[1, 2]), BATCH, seed=SEED, num_workers=0)

    full = Counter(epoch(make()))
    assert sum(full.values()) == 24
    first = make()
    head = []
    for _, batch in zip(range(2), first):
        head += [ident(*sample) for sample in zip(*batch)]
    state = json.loads(json.dumps(first.state_dict()))
    second = make()
    second.load_state_dict(state)
    assert Counter(head + epoch(second)) == full
    with pytest.raises(pixfeed.errors.OptionError, match="another dataset"):
        other = make_loader(mixed(packs, repeats=[2, 1]), BATCH, seed=SEED, num_workers=0)
        other.load_state_dict(state)


def test_a_mixture_file_of_packs_and_refusals(packs, tmp_path):
    spec = {"pixfeed_mixture": 1, "sources": [{"path": str(packs / "a")}, {"path": str(packs / "b")}],
            "counts": [3, 9]}
    (tmp_path / "mix.json").write_text(json.dumps(spec))
    mixture = open_dataset(tmp_path / "mix.json")
    assert isinstance(mixture, StreamMixture) and mixture.quotas == [3, 9]
    rows = dict(mixture_file.describe(tmp_path / "mix.json"))
    assert rows["epoch size"] == "12 samples" and "12 records" in rows["sources"][0]

    class Numbers(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(MixtureError, match=r"source 1 \(Numbers\): an iterable dataset other than a pixfeed "
                                           r"WebDataset pack"):
        pixfeed.mix([open_dataset(packs / "a"), Numbers()])
    with pytest.raises(MixtureError, match=r"source 1 \(.*b\): the same dataset as source 0"):
        pixfeed.mix([open_dataset(packs / "b"), open_dataset(packs / "b")])


def test_a_record_read_twice_in_an_epoch_gets_two_crops_and_a_source_may_take_no_share(packs):
    crops = pixfeed.mix([open_dataset(packs / "a", size=4, crop="random"),
                         open_dataset(packs / "b", size=4, crop="random")], repeats=[0, 2], with_source=True)
    assert crops.quotas == [0, 12]
    seen = epoch(make_loader(crops, BATCH, seed=SEED, num_workers=0))
    assert len(seen) == 12 and {s for s, _, _ in seen} == {1}
    assert len(set(seen)) > 9  # 6 records read twice: crops drawn per pass (per record only: at most 6)


def test_a_resume_mid_epoch_with_two_workers_reads_exactly_the_rest(packs):
    def make():
        return make_loader(mixed(packs, counts=[10, 10]), BATCH, seed=SEED, num_workers=2)

    full = epoch(make())
    first = make()
    batches = iter(first)
    head = [ident(*sample) for _, batch in zip(range(3), batches) for sample in zip(*batch)]
    state = json.loads(json.dumps(first.state_dict()))
    del batches
    second = make()
    second.load_state_dict(state)
    assert Counter(head + epoch(second)) == Counter(full) and len(full) == 20


def test_on_error_skip_leaves_a_damaged_record_of_a_pack_out(packs, tmp_path):
    damaged = tmp_path / "b"
    shutil.copytree(packs / "b", damaged)
    shard = sorted(damaged.glob("*.tar"))[0]
    with tarfile.open(shard) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(".npy"))
    blob = bytearray(shard.read_bytes())
    blob[member.offset_data + member.size - 5] ^= 0x40  # a pixel of the first image, its checksum now wrong
    shard.write_bytes(bytes(blob))
    mixture = pixfeed.mix([open_dataset(packs / "a"), open_dataset(damaged)], with_source=True)
    with pytest.raises(pixfeed.errors.CorruptDataError, match=shard.name):
        epoch(make_loader(mixture, BATCH, seed=SEED, num_workers=0))
    loader = make_loader(mixture, BATCH, seed=SEED, num_workers=0, on_error="skip")
    with pytest.warns(RuntimeWarning, match="skipped a damaged record"):
        seen = epoch(loader)
    assert len(seen) == 17 and Counter(s for s, _, _ in seen) == {0: 12, 1: 5} and loader.pixfeed_plan.skipped == 1
