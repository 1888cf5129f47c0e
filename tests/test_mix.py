"""pixfeed.mix: several datasets in one loader, with exact quotas per epoch, the order, split by rank and resume
of a single dataset, classes mapped by name, and one named error for each kind of bad input."""
from __future__ import annotations

import json
import math
from collections import Counter
from typing import List

import numpy as np
import pytest
import torch

import pixfeed
from conftest import make_tree
from pixfeed.datasets import open_dataset
from pixfeed.errors import MixtureError
from pixfeed.loaders import make_loader
from pixfeed.loaders._testing import ArrayDataset, random_images
from pixfeed.mixing.quotas import Stream, apportion
from pixfeed.packers import pack

BATCH, SEED = 4, 5


def arrays(*lengths: int, side: int = 2) -> List[ArrayDataset]:
    """One small dataset per length; labels are record indices, so (source, label) names a record."""
    return [ArrayDataset(random_images(n, side, side, seed=k)) for k, n in enumerate(lengths)]


def identities(loader) -> List[tuple]:
    """(source, record) of every sample of one epoch, in order."""
    return [(int(s), int(r)) for _, records, sources in loader for r, s in zip(records, sources)]


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    """The same kind of tree packed as stored pixels (mmap) and as encoded JPEG/PNG (LMDB); a second class
    list (dog, fox) for the class mapping."""
    root = tmp_path_factory.mktemp("mix")
    pack(make_tree(root / "src", per_class=4), root / "mmap", "mmap", store="pixels", size=24, workers=1)
    pack(make_tree(root / "src2", classes=("fox", "dog"), per_class=3), root / "lmdb", "lmdb", store="encoded",
         workers=1)
    pack(make_tree(root / "src3", per_class=2), root / "wds", "wds", store="encoded", workers=1)
    return root


def test_quotas_are_exact_every_epoch_and_shares_within_half_a_percent_of_the_weights():
    sources = arrays(50, 300, 7)
    mixture = pixfeed.mix(sources, weights=[2, 0.5, 1], epoch_size=701, with_source=True)
    assert mixture.quotas == apportion(701, [2, 0.5, 1]) == [401, 100, 200] and len(mixture) == 701
    loader = make_loader(mixture, 32, seed=SEED, num_workers=0)
    totals = Counter()
    for epoch in range(20):
        seen = identities(loader)
        per_source = Counter(s for s, _ in seen)
        assert [per_source[s] for s in range(3)] == mixture.quotas, epoch
        for s, n in enumerate((50, 300, 7)):  # within its share, no record twice before every one once
            counts = Counter(r for src, r in seen if src == s)
            assert max(counts.values()) - min(counts.get(r, 0) for r in range(n)) <= 1
        totals.update(per_source)
    for s, weight in enumerate([2, 0.5, 1]):
        assert abs(totals[s] / sum(totals.values()) - weight / 3.5) < 0.005


def test_a_source_seen_2_5_times_is_every_sample_twice_and_a_different_half_each_epoch():
    stream = Stream(10, 25, 0)
    extras = []
    for epoch in range(6):
        counts = np.bincount(stream.epoch_records(SEED, epoch), minlength=10)
        assert sorted(counts) == [2] * 5 + [3] * 5
        extras.append(frozenset(np.flatnonzero(counts == 3).tolist()))
    for a, b in zip(extras[0::2], extras[1::2]):  # one permutation cut in two halves
        assert a | b == set(range(10)) and not a & b
    assert len(set(extras)) >= 4  # then cut anew
    below = Stream(10, 3, 1)  # three tenths per epoch: 9 of the 10 records in 3 epochs, none twice
    for block in range(4):
        three = np.concatenate([below.epoch_records(SEED, e) for e in range(3 * block, 3 * block + 3)])
        assert len(set(three.tolist())) == 9


def test_counts_and_repeats_say_the_epoch(packs):
    a, b = arrays(10, 6)
    assert pixfeed.mix([a, b], counts=[4, 9]).quotas == [4, 9]
    assert pixfeed.mix([a, b], repeats=[2.5, 0.5]).quotas == [25, 3]
    assert pixfeed.mix([a, b]).quotas == [10, 6]
    assert pixfeed.mix([a, b], [1, 1]).quotas == [8, 8]  # weights: an epoch of as many samples as they hold


class Rank:
    """A loader used as rank ``rank`` of ``world`` (RANK and WORLD_SIZE set around every use)."""

    def __init__(self, monkeypatch, dataset, rank: int, world: int, **options) -> None:
        self.env, self.rank, self.world = monkeypatch, rank, world
        self.loader = self.run(make_loader, dataset, BATCH, seed=SEED, distributed=True, **options)

    def run(self, fn, *args, **kwargs):
        self.env.setenv("RANK", str(self.rank))
        self.env.setenv("WORLD_SIZE", str(self.world))
        return fn(*args, **kwargs)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_every_sample_of_every_source_once_an_epoch_on_any_number_of_ranks(monkeypatch, world):
    mixture = pixfeed.mix(arrays(13, 7, 4), with_source=True)  # 24 samples: no padding on 1, 2 or 4 ranks
    everything = {(s, r) for s, n in enumerate((13, 7, 4)) for r in range(n)}
    epochs = []
    for epoch in range(2):
        ranks = [Rank(monkeypatch, mixture, rank, world, num_workers=0) for rank in range(world)]
        for r in ranks:
            r.loader.set_epoch(epoch)
        per_rank = [r.run(identities, r.loader) for r in ranks]
        assert len({len(p) for p in per_rank}) == 1  # equal shares
        assert sorted(x for p in per_rank for x in p) == sorted(everything)  # disjoint, and the whole epoch
        epochs.append(per_rank)
    assert epochs[0] != epochs[1]
    one = make_loader(mixture, BATCH, seed=SEED, num_workers=0, distributed=False)
    positions = list(one.sampler)  # epoch 0's global order, the same whatever the number of ranks:
    mixture.set_epoch(0)
    order = list(zip(*(a.tolist() for a in mixture.locate(positions)[:2])))
    for rank, got in enumerate(epochs[0]):  # rank r reads positions r, r + world, ... (a batch grouped by source)
        assert [sorted(b) for b in _in_batches(got)] == [sorted(b) for b in _in_batches(order[rank::world])]


def test_every_sample_once_on_two_ranks_of_two_workers(monkeypatch):
    mixture = pixfeed.mix(arrays(9, 7), with_source=True)  # 16 samples: 8 a rank, 2 batches a worker
    ranks = [Rank(monkeypatch, mixture, rank, 2, num_workers=2) for rank in range(2)]
    per_rank = [r.run(identities, r.loader) for r in ranks]
    assert [len(p) for p in per_rank] == [8, 8]
    assert sorted(per_rank[0] + per_rank[1]) == sorted((s, r) for s, n in enumerate((9, 7)) for r in range(n))


def _in_batches(samples: list) -> list:
    return [samples[i:i + BATCH] for i in range(0, len(samples), BATCH)]


def test_two_workers_read_the_same_epochs_as_none(packs):
    mixture = pixfeed.mix([open_dataset(packs / "mmap", size=16, crop="random"),
                           open_dataset(packs / "lmdb", size=16, crop="random")], repeats=[1, 2], with_source=True)
    epochs = {}
    for workers in (0, 2):
        loader = make_loader(mixture, BATCH, seed=SEED, num_workers=workers)
        epochs[workers] = [[t.clone() for t in batch] for _ in range(2) for batch in loader]
    assert len(epochs[0]) == len(epochs[2]) == 2 * math.ceil((12 + 2 * 6) / BATCH)
    for got, want in zip(epochs[2], epochs[0]):
        assert all(torch.equal(x, y) for x, y in zip(got, want))
    sources = Counter(int(s) for _, _, sources in epochs[2] for s in sources)
    assert sources == {0: 24, 1: 24}  # two epochs of 12 from mmap and 2 x 6 from LMDB


@pytest.mark.parametrize("size", [16, None])  # a center crop of the stored pixels, or read as stored (24)
def test_a_batch_holds_what_its_sources_read_and_a_record_seen_twice_gets_two_crops(packs, size):
    mmap, lmdb = open_dataset(packs / "mmap", size=size), open_dataset(packs / "lmdb", size=size or 24)
    mixture = pixfeed.mix([mmap, lmdb], repeats=[1, 2], with_source=True)
    mixture.set_epoch(3)
    indices = np.random.default_rng(0).permutation(len(mixture))[:10]
    images, labels, sources = mixture.get_batch(indices)
    where, records, _ = mixture.locate(indices)
    order = np.lexsort((records, _, where))  # a batch comes grouped by source and pass, in record order
    for image, label, s, r in zip(images, labels, sources, records[order]):
        want_image, want_label = [mmap, lmdb][int(s)][int(r)]
        assert torch.equal(image, want_image)
        assert mixture.classes[int(label)] == [mmap, lmdb][int(s)].classes[want_label]
    assert images.stride()[1] == 1  # channels_last, as a single dataset's batches
    crops = pixfeed.mix([open_dataset(packs / "mmap", size=8, crop="random"),
                         open_dataset(packs / "lmdb", size=8, crop="random")], repeats=[1, 2], with_source=True)
    everything = np.arange(len(crops))
    where, records, passes = crops.locate(everything)
    twice = [np.flatnonzero((where == 1) & (records == r)) for r in range(6)]
    pictures = crops.get_batch(everything)[0]
    lmdb_rows = np.flatnonzero(np.sort(where) == 1)  # the rows of source 1, in (pass, record) order
    first, second = lmdb_rows[:6], lmdb_rows[6:]
    assert all(len(t) == 2 for t in twice)
    assert sum(not torch.equal(pictures[i], pictures[j]) for i, j in zip(first, second)) >= 4


def test_classes_are_mapped_by_name_or_kept_as_stored(packs):
    mmap, lmdb = open_dataset(packs / "mmap"), open_dataset(packs / "lmdb", size=24)
    assert (mmap.classes, lmdb.classes) == (["cat", "dog", "eel"], ["dog", "fox"])
    mixture = pixfeed.mix([mmap, lmdb], with_source=True)
    assert mixture.classes == ["cat", "dog", "eel", "fox"]
    _, labels, sources = mixture.get_batch(range(len(mixture)))
    where, records, passes = mixture.locate(range(len(mixture)))
    records = records[np.lexsort((passes, where))]  # as the batch: grouped by source
    for label, source, record in zip(labels.tolist(), sources.tolist(), records.tolist()):
        ds = [mmap, lmdb][source]
        assert mixture.classes[label] == ds.classes[int(ds.get_batch([record])[1][0])]
    assert mixture.classes[mixture[13][1]] == lmdb.classes[lmdb[int(mixture.locate([13])[1][0])][1]]
    kept = pixfeed.mix([mmap, lmdb], labels="as_stored")
    assert kept.classes is None
    assert sorted(int(kept[i][1]) for i in range(len(kept))) == sorted([0, 1, 2] * 4 + [0, 1] * 3)
    images, labels = pixfeed.mix([lmdb, open_dataset(packs / "mmap", size=24)]).get_batch(range(18))
    assert sorted(labels.tolist()) == sorted([0, 1] * 3 + [2, 0, 3] * 4)  # dog fox, then cat dog eel


def first_batches(loader, count: int) -> List[tuple]:
    out = []
    for _, records, sources in loader:
        out += [(int(s), int(r)) for r, s in zip(records, sources)]
        count -= 1
        if not count:
            return out


@pytest.mark.parametrize("worlds,drop_last", [((2, 3), False), ((4, 1), False), ((3, 2), True)])
def test_a_resume_on_another_world_size_reads_exactly_the_rest_of_the_epoch(monkeypatch, worlds, drop_last):
    mixture = pixfeed.mix(arrays(30, 11), weights=[1, 3], epoch_size=48, with_source=True)
    full = Counter(identities(make_loader(mixture, BATCH, seed=SEED, num_workers=0, distributed=False)))
    assert sum(full.values()) == 48 and max(full.values()) > 1  # 36 of 11 records: some 4 times an epoch
    before, after = worlds
    ranks = [Rank(monkeypatch, mixture, rank, before, num_workers=0, drop_last=drop_last) for rank in range(before)]
    head = [r.run(first_batches, r.loader, 2) for r in ranks]
    state = json.loads(json.dumps(ranks[0].run(ranks[0].loader.state_dict)))
    resumed = [Rank(monkeypatch, mixture, rank, after, num_workers=0, drop_last=drop_last) for rank in range(after)]
    for r in resumed:
        r.run(r.loader.load_state_dict, state)
    tail = [r.run(identities, r.loader) for r in resumed]
    assert len({len(t) for t in tail}) == 1
    seen = Counter(x for part in head + tail for x in part)
    consumed = 2 * BATCH * before
    if drop_last:  # up to after - 1 samples left out, and each rank's last partial batch: nothing twice
        assert not seen - full and sum(seen.values()) == consumed + (48 - consumed) // after // BATCH * BATCH * after
    else:  # nothing lost; the first (consumed - 48) % after of the rest repeat to give every rank as many
        assert not full - seen and sum(seen.values()) - 48 == (consumed - 48) % after


def test_a_resume_on_the_same_world_reads_the_same_batches_and_a_state_knows_its_mixture(packs):
    def make(weights):
        sources = [open_dataset(packs / "mmap", size=12, crop="random"), open_dataset(packs / "lmdb", size=12)]
        return make_loader(pixfeed.mix(sources, weights, epoch_size=20), BATCH, seed=SEED, num_workers=0)

    uninterrupted = make([1, 2])
    reference = [[t.clone() for t in b] for _ in range(2) for b in uninterrupted]
    first = make([1, 2])
    head = [[t.clone() for t in b] for _, b in zip(range(3), first)]
    state = json.loads(json.dumps(first.state_dict()))
    second = make([1, 2])
    second.load_state_dict(state)
    rest = [[t.clone() for t in b] for _ in range(2) for b in second]
    assert len(head + rest) == len(reference)
    for got, want in zip(head + rest, reference):
        assert all(torch.equal(x, y) for x, y in zip(got, want))
    with pytest.raises(pixfeed.errors.OptionError, match="another dataset"):
        make([2, 1]).load_state_dict(state)


def test_the_plan_says_each_sources_share_and_cost(packs):
    mixture = pixfeed.mix([open_dataset(packs / "mmap", size=16), open_dataset(packs / "lmdb", size=16)], [3, 1])
    plan = str(make_loader(mixture, BATCH, num_workers=0).pixfeed_plan)
    assert f"source 0 ({packs / 'mmap'}): 14 of 18 samples an epoch (77.8%; weight 3: 1.17x its 12 records); " \
           "mmap pixels" in plan
    assert "source 1" in plan and "4 of 18 samples" in plan and "decodes or crops each image" in plan


def test_bad_input_is_one_named_error_each_before_any_worker_starts(packs):
    a, b = arrays(5, 6)
    cases = [
        (lambda: pixfeed.mix([a, ArrayDataset(random_images(0, 2, 2))]), r"source 1 \(ArrayDataset\): holds no samples"),
        (lambda: pixfeed.mix([a, b], [1, -1]), r"weights: -1 for source 1 .* must be a finite number >= 0"),
        (lambda: pixfeed.mix([a, b], [float("nan"), 1]), r"weights: nan for source 0"),
        (lambda: pixfeed.mix([a, b], [0, 0]), r"every one is zero"),
        (lambda: pixfeed.mix([a, b], [1]), r"1 numbers for 2 sources"),
        (lambda: pixfeed.mix([a, b], counts=[1, 2.5]), r"counts: 2.5 for source 1 .* not a whole number"),
        (lambda: pixfeed.mix([a, b], [1, 1], counts=[1, 2]), r"weights and counts: give one way"),
        (lambda: pixfeed.mix([a, b], epoch_size=10), r"epoch_size goes with weights="),
        (lambda: pixfeed.mix([a, a]), r"source 1 \(ArrayDataset\): the same dataset as source 0"),
        (lambda: pixfeed.mix([open_dataset(packs / "mmap"), open_dataset(packs / "mmap", size=8)]),
         r"source 1 \(.*mmap\): the same dataset as source 0"),
        (lambda: pixfeed.mix([a, ArrayDataset(random_images(4, 3, 3))]),
         r"source 1 \(ArrayDataset\) gives images of shape 3x3x3, source 0 \(ArrayDataset\) of 3x2x2"),
        (lambda: pixfeed.mix([open_dataset(packs / "mmap"), open_dataset(packs / "lmdb")]),
         r"gives images of shape varying sizes \(no size=\), source 0 .* of 3x24x24; open them with one size="),
        (lambda: pixfeed.mix([open_dataset(packs / "mmap"), open_dataset(packs / "wds", size=24)]),
         r"source 1 \(.*wds\) is an iterable dataset .* and source 0 \(.*mmap\) a map-style one .* repack one"),
        (lambda: pixfeed.mix([a, b], labels="merge"), r"labels='merge': expected 'by_name' or 'as_stored'"),
        (lambda: pixfeed.mix([]), r"give a list of datasets"),
    ]
    for make, message in cases:
        with pytest.raises(MixtureError, match=message):
            make()


def test_a_path_is_opened_and_fields_must_agree(packs):
    mixture = pixfeed.mix([packs / "mmap"])
    assert len(mixture) == 12 and mixture.fixed_shape == (3, 24, 24)
    with pytest.raises(MixtureError, match=r"returns fields \('image',\), source 0 .* returns \('image', 'label'\)"):
        pixfeed.mix([open_dataset(packs / "mmap"), open_dataset(packs / "lmdb", size=24, fields=("image",))])


def test_a_mixture_file_opens_as_its_mixture_and_info_describes_it(packs, tmp_path, capsys):
    from pixfeed.cli import main

    spec = {"pixfeed_mixture": 1, "weights": [1, 3], "epoch_size": 8, "with_source": True,
            "sources": [{"path": str(packs / "mmap"), "size": 16}, {"path": "lmdb", "size": 16, "crop": "random"}]}
    (packs / "mix.json").write_text(json.dumps(spec))
    mixture = open_dataset(packs / "mix.json")  # "lmdb": relative to the file's folder
    assert mixture.quotas == [2, 6] and mixture.with_source and mixture.sources[1].crop == "random"
    images, labels, sources = next(iter(make_loader(mixture, 8, num_workers=0)))
    assert images.shape == (8, 3, 16, 16) and sorted(sources.tolist()) == [0, 0] + [1] * 6
    assert main(["info", str(packs / "mix.json")]) == 0
    out = capsys.readouterr().out
    assert "1: lmdb (lmdb, 6 records; size=16, crop='random'): 6 an epoch (75.0%)" in out
    assert "weights 1, 3, epoch_size 8" in out and "classes     4: cat, dog, eel, fox" in out
    bad = tmp_path / "bad.json"
    for text, message in [('{"pixfeed_mixture": 1, "sources": [{"path": "x"}], "weight": [1]}', "unknown key 'weight'"),
                          ('{"pixfeed_mixture": 1, "sources": [{"size": 8}]}', "source 0 has no \"path\""),
                          ('{"sources": []}', "not a mixture file"), ("{", "not valid JSON")]:
        bad.write_text(text)
        with pytest.raises(MixtureError, match=message):
            open_dataset(bad)
        assert main(["info", str(bad)]) == 2 and message in capsys.readouterr().err
    with pytest.raises(MixtureError, match="names each source's options itself; give size"):
        open_dataset(packs / "mix.json", size=8)


def test_a_local_and_a_bucket_source_mix(packs, tmp_path, bucket, s3_server):
    """A source in a bucket larger than its cache (read through chunks) beside a local one: each sample once."""
    so = s3_server.options
    pack(make_tree(tmp_path / "src", classes=("eel", "fox"), per_class=5), f"{bucket}/ds", "mmap", store="pixels",
         size=24, workers=1, storage_options=so)
    remote = open_dataset(f"{bucket}/ds", storage_options=so, cache_dir=tmp_path / "cache", cache_limit=8192,
                          chunk_bytes=4096)
    assert remote.chunks is not None  # read through the chunk cache
    mixture = pixfeed.mix([open_dataset(packs / "mmap"), remote], with_source=True)
    loader = make_loader(mixture, BATCH, seed=SEED, num_workers=0)
    seen = [(int(s), int(label)) for _, labels, sources in loader for label, s in zip(labels, sources)]
    assert mixture.classes == ["cat", "dog", "eel", "fox"]  # the bucket's eel and fox: 2 and 3
    assert sorted(seen) == sorted([(0, c) for c in (0, 1, 2) for _ in range(4)] + [(1, c) for c in (2, 3)
                                                                                   for _ in range(5)])
    assert "from a bucket" in str(loader.pixfeed_plan)


def _requested(monkeypatch) -> list:
    """(file, offset, length) of every WILLNEED the read-ahead asks for, as it asks."""
    import os
    asked, advise = [], os.posix_fadvise

    def record(fd, offset, length, advice):
        if advice == os.POSIX_FADV_WILLNEED:
            asked.append((os.path.realpath(os.readlink(f"/proc/self/fd/{fd}")), offset, length))
        return advise(fd, offset, length, advice)
    monkeypatch.setattr(os, "posix_fadvise", record)
    return asked


def _bytes(ranges, size: int) -> np.ndarray:
    mask = np.zeros(size, bool)
    for start, length in ranges:
        mask[start:start + length] = True
    return mask


def test_read_ahead_requests_each_sources_file_for_its_records_in_the_mixtures_order(tmp_path, monkeypatch):
    """Two local packs: each source's data file is requested for exactly its records of the epoch (a budget
    larger than the epoch: all of them at the first index), nothing of the other source's, no whole file."""
    import os
    import time

    from pixfeed.loaders.readahead import Hinter
    for name, classes, count in (("first", ("cat", "dog"), 6), ("second", ("eel", "fox"), 5)):  # files no other
        pack(make_tree(tmp_path / name / "src", classes=classes, per_class=count), tmp_path / name / "pack", "mmap",
             store="pixels", size=24, workers=1)  # test's read-ahead touches
    sources = [open_dataset(tmp_path / "first" / "pack"), open_dataset(tmp_path / "second" / "pack")]
    mixture = pixfeed.mix(sources, repeats=[1.5, 0.6])
    mixture.use_seed(SEED)
    mixture.set_epoch(3)
    extents = mixture.record_extents()
    assert [p.path for p in extents.parts] == [s.record_extents().path for s in sources]
    asked = _requested(monkeypatch)
    order = np.random.default_rng(0).permutation(len(mixture))
    handed = Hinter(extents, 1 << 30).follow(order)
    first = next(handed)
    files = [os.path.realpath(p.path) for p in extents.parts]
    source, records, _ = mixture.locate(order)
    want = [_bytes(zip(*ds.record_extents().of(records[source == s])), os.path.getsize(name))
            for s, (ds, name) in enumerate(zip(sources, files))]

    def requested(name: str) -> list:
        return [(o, n) for f, o, n in list(asked) if f == name]
    deadline = time.monotonic() + 30  # the request thread asks for the whole epoch at the first index
    while time.monotonic() < deadline and not all(
            (_bytes(requested(name), len(w)) >= w).all() for name, w in zip(files, want)):
        time.sleep(0.01)
    for name, w in zip(files, want):
        mine = requested(name)
        assert mine and all(n > 0 for _, n in mine)  # no length 0: posix_fadvise reads that as the whole file
        assert (_bytes(mine, len(w)) == w).all()  # this source's records of the epoch, nothing else
    assert [first, *handed] == order.tolist()


def test_a_quota_lists_its_records_in_file_order_pass_after_pass():
    """What makes quasi-random order read runs of one source's file: consecutive positions, nearby records."""
    stream = Stream(10, 23, 0)  # two passes and 3 extras
    for epoch in range(4):
        records = stream.epoch_records(SEED, epoch)
        assert records[:20].tolist() == list(range(10)) * 2
        extras = records[20:]
        assert len(set(extras)) == 3 and (np.diff(extras) > 0).all()


def test_quasi_random_order_and_read_ahead_over_a_mixture_read_every_sample_once(packs, monkeypatch):
    """order='quasi_random' with io_ahead: the plan takes them and each epoch still holds every sample once."""
    sources = [open_dataset(packs / "mmap"), open_dataset(packs / "lmdb", size=24)]
    mixture = pixfeed.mix(sources, with_source=True, labels="as_stored")
    asked = _requested(monkeypatch)
    loader = make_loader(mixture, BATCH, seed=SEED, num_workers=0, order="quasi_random", io_ahead=1 << 20)
    plan = loader.pixfeed_plan
    assert plan.order == "quasi_random" and plan.io_ahead == 1 << 20 and loader.sampler.quasi is not None
    want = sorted((s, int(ds[i][1])) for s, ds in enumerate(sources) for i in range(len(ds)))
    for epoch in range(2):
        loader.set_epoch(epoch)
        seen = [(int(s), int(label)) for _, labels, ss in loader for label, s in zip(labels, ss)]
        assert sorted(seen) == want
    assert plan.hints is False or asked  # requested unless every page was cached already


def test_a_bucket_source_is_fetched_ahead_in_the_mixtures_order(packs, tmp_path, bucket, s3_server):
    """Beside a local pack, the bucket source's chunks are planned in the mixture's order (its records among the
    sampler's indices, no chunk for the local source's) and fetched ahead at the first index, before any read."""
    import threading
    import time

    from pixfeed.loaders.fetcher import Fetcher, Uses
    so = s3_server.options
    pack(make_tree(tmp_path / "src", classes=("eel", "fox"), per_class=8), f"{bucket}/ahead", "mmap",
         store="pixels", size=24, workers=1, storage_options=so)
    remote = open_dataset(f"{bucket}/ahead", storage_options=so, cache_dir=tmp_path / "cache", cache_limit=16384,
                          chunk_bytes=4096)
    mixture = pixfeed.mix([open_dataset(packs / "mmap"), remote])
    loader = make_loader(mixture, BATCH, seed=SEED, num_workers=0)
    fetchers = [h for h in getattr(loader.sampler.hints, "hints", []) if isinstance(h, Fetcher)]
    assert len(fetchers) == 1 and fetchers[0].cache is remote.chunks
    assert "fetched ahead in the mixture's order" in loader.pixfeed_plan.reasons["storage"]
    assert loader.pixfeed_plan.order == "quasi_random"  # order='auto', the source larger than its cache: as alone
    assert make_loader(mixture, BATCH, seed=SEED, num_workers=0, order="random").pixfeed_plan.order == "random"
    loader.sampler.set_epoch(0)
    mixture.set_epoch(0)
    stream = fetchers[0].stream()
    source, records, _ = mixture.locate(stream)
    starts, lengths = remote.record_extents().of(records[source == 1])
    chunks = [k for a, n in zip(starts.tolist(), lengths.tolist()) for k in range(a // 4096, (a + n - 1) // 4096 + 1)]
    plan = [c for i, c in enumerate(chunks) if not i or c != chunks[i - 1]]
    assert Uses(remote.chunks, fetchers[0].extents, stream).sequence().tolist() == plan

    asked, fetch = [], remote.chunks.fetch

    def record(k, *args, **kwargs):
        asked.append((k, threading.current_thread().name))
        return fetch(k, *args, **kwargs)
    remote.chunks.fetch = record
    handed = loader.sampler.hints.follow(loader.sampler.indices())
    next(handed)  # nothing read: every fetch is the fetcher's
    present = set(remote.chunks.present())  # the .npy header's chunk, read when the dataset was opened
    first = [k for k in list(dict.fromkeys(plan))[:3] if k not in present]  # a cache of 4 chunks: 3 ahead
    assert first
    deadline = time.monotonic() + 30
    while len(asked) < len(first) and time.monotonic() < deadline:
        time.sleep(0.01)
    handed.close()
    assert sorted(k for k, _ in asked) == sorted(first)
    assert all(name.startswith("pixfeed-fetch") for _, name in asked)
