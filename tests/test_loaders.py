"""make_loader: a real DataLoader, the path and options it picks, order across epochs, errors."""
from __future__ import annotations

import os
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from pixfeed.errors import OptionError, SharedMemoryError
from pixfeed.loaders import PixfeedLoader, make_loader, shm
from pixfeed.loaders._testing import ArrayDataset, random_images
from pixfeed.loaders.plan import PREFETCH_BUDGET


class SamplesOnly(ArrayDataset):
    """Same data, but no usable get_batch: the loader must collate samples."""
    fixed_shape = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fixed_shape = None


class Stream(IterableDataset):
    def __init__(self, count=10):
        self.count, self.epochs, self.rank, self.world_size = count, [], 0, 1

    def set_epoch(self, epoch):
        self.epochs.append(epoch)

    def __iter__(self):
        return iter(range(self.rank, self.count, self.world_size))


class LazyHandles(Dataset):
    """A user's dataset that opens its handle on the first read in each process, and logs the process."""

    def __init__(self, log, count=12):
        self.log, self.count, self.handle = log, count, None

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        if self.handle is None:
            self.handle = os.getpid()
            with open(self.log, "a") as f:
                f.write(f"{self.handle}\n")
        return torch.full((3, 4, 4), index, dtype=torch.uint8), index


def labels_of(loader):
    return [int(x) for _, labels in loader for x in labels]


@pytest.fixture
def dataset():
    return ArrayDataset(random_images(37))


def test_is_a_dataloader_and_explains_itself(dataset):
    loader = make_loader(dataset, 8)
    assert isinstance(loader, DataLoader) and isinstance(loader, PixfeedLoader)
    text = str(loader.pixfeed_plan)
    for option in ("path", "num_workers", "read_ahead", "pin_memory", "persistent_workers", "prefetch_factor"):
        assert option in text
    assert all(loader.pixfeed_plan.reasons.values())


def test_pixel_dataset_reads_whole_batches_in_process(dataset):
    loader = make_loader(dataset, 8, shuffle=False)
    plan = loader.pixfeed_plan
    assert (plan.path, plan.num_workers) == ("batch", 0)
    images = torch.cat([batch for batch, _ in loader])
    assert torch.equal(images, torch.from_numpy(dataset.images).permute(0, 3, 1, 2))
    assert dataset.batch_calls == len(loader) == 5


def test_samples_path_gathers_each_batch_in_one_call():
    dataset = SamplesOnly(random_images(20))
    loader = make_loader(dataset, 6, num_workers=0, drop_last=True)
    assert loader.pixfeed_plan.path == "samples"
    assert len(set(labels_of(loader))) == 18  # 2 left out by drop_last
    assert dataset.batch_calls == len(loader) == 3


def test_plain_torch_dataset_works():
    data = TensorDataset(torch.arange(10.0), torch.arange(10))
    loader = make_loader(data, 4, num_workers=0, shuffle=False)
    assert loader.pixfeed_plan.path == "samples"
    assert labels_of(loader) == list(range(10))


def test_each_epoch_is_a_new_permutation(dataset):
    loader = make_loader(dataset, 8)
    first, second = labels_of(loader), labels_of(loader)
    assert sorted(first) == sorted(second) == list(range(37))
    assert first != second


def test_same_seed_same_order_other_seed_other_order(dataset):
    runs = [make_loader(dataset, 8, seed=seed) for seed in (1, 1, 2)]
    epochs = [[labels_of(loader) for _ in range(2)] for loader in runs]
    assert epochs[0] == epochs[1]
    assert epochs[0][0] != epochs[2][0]


def test_set_epoch_resumes_the_order(dataset):
    straight = make_loader(dataset, 8)
    labels_of(straight)
    resumed = make_loader(dataset, 8)
    resumed.set_epoch(1)
    assert labels_of(resumed) == labels_of(straight)


def test_no_shuffle_keeps_order(dataset):
    assert labels_of(make_loader(dataset, 10, shuffle=False)) == list(range(37))


def test_batch_bytes_are_learnt_without_opening_a_handle_in_this_process(tmp_path):
    log = tmp_path / "opened"
    dataset = LazyHandles(log)
    loader = make_loader(dataset, 4, num_workers=2)
    assert loader.pixfeed_plan.batch_bytes == 4 * (3 * 4 * 4 + 8)  # sample 0 was read, elsewhere
    assert dataset.handle is None and str(os.getpid()) not in log.read_text().split()
    assert sorted(labels_of(loader)) == list(range(12))
    opened = log.read_text().split()
    assert str(os.getpid()) not in opened and len(set(opened)) == 3  # the probe and each of the 2 workers


def test_cpu_bound_dataset_gets_persistent_workers():
    loader = make_loader(ArrayDataset(random_images(40), augment=True), 4, num_workers=2)
    plan = loader.pixfeed_plan
    assert (plan.num_workers, plan.persistent_workers, plan.pin_memory) == (2, True, torch.cuda.is_available())
    assert 1 <= plan.prefetch_factor <= 4 and loader.worker_init_fn is not None
    assert sorted(labels_of(loader)) == list(range(40))


def test_prefetch_shrinks_with_big_batches(monkeypatch):
    dataset = ArrayDataset(random_images(4), augment=True)
    batch_bytes = (3 * 8 * 8 + 8) * 2
    monkeypatch.setattr("pixfeed.loaders.plan.PREFETCH_BUDGET", batch_bytes * 2 * 3)
    assert make_loader(dataset, 2, num_workers=2).pixfeed_plan.prefetch_factor == 3
    assert make_loader(dataset, 2, num_workers=2, prefetch_factor=2).prefetch_factor == 2
    assert PREFETCH_BUDGET >= 1 << 28


def test_shared_memory_shortage_lowers_prefetch_then_reads_in_process(monkeypatch):
    dataset = ArrayDataset(random_images(64), augment=True)
    one_batch = (3 * 8 * 8 + 8) * 8
    monkeypatch.setattr(shm, "_warned", False)
    monkeypatch.setattr(shm, "shm_free_bytes", lambda path=shm.SHM_DIR: one_batch * 2 * 2 * 2)  # 2 per worker
    plan = make_loader(dataset, 8, num_workers=2, prefetch_factor=4).pixfeed_plan
    assert (plan.prefetch_factor, plan.sharing_strategy) == (2, torch.multiprocessing.get_sharing_strategy())
    assert "lowered from 4 to fit /dev/shm" in plan.reasons["prefetch_factor"]
    monkeypatch.setattr(shm, "shm_free_bytes", lambda path=shm.SHM_DIR: one_batch)
    monkeypatch.setattr("pixfeed.loaders.loader.available_cpus", lambda: 2)
    with pytest.warns(RuntimeWarning, match="num_workers=0.*--shm-size=1g"):
        loader = make_loader(dataset, 8)
    assert (loader.num_workers, loader.pixfeed_plan.prefetch_factor) == (0, None)
    assert "does not fit: 1.6 KiB free in /dev/shm" in loader.pixfeed_plan.reasons["num_workers"]
    assert sorted(labels_of(loader)) == list(range(64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_loader(dataset, 8)  # warned once only
    with pytest.raises(SharedMemoryError, match=r"num_workers=2: /dev/shm has 1.6 KiB free, but 2 worker\(s\) "
                                                r"need 3.1 KiB .*--shm-size=1g, or --ipc=host"):
        make_loader(dataset, 8, num_workers=2)


def test_file_system_sharing_only_for_a_low_open_file_limit(monkeypatch):
    before = torch.multiprocessing.get_sharing_strategy()
    dataset = ArrayDataset(random_images(16), augment=True)
    assert make_loader(dataset, 4, num_workers=2).pixfeed_plan.sharing_strategy == before
    monkeypatch.setattr(shm.resource, "getrlimit", lambda kind: (300, 300))  # < 2 x 4 x 8 + 256
    try:
        plan = make_loader(dataset, 4, num_workers=2, prefetch_factor=4).pixfeed_plan
        assert plan.sharing_strategy == "file_system" == torch.multiprocessing.get_sharing_strategy()
        assert "open-file limit 300 < 320" in plan.reasons["sharing_strategy"]
    finally:
        torch.multiprocessing.set_sharing_strategy(before)


def test_iterable_dataset_gets_set_epoch_and_rank(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    stream = Stream()
    loader = make_loader(stream, 2, num_workers=0, distributed=True)
    assert [list(map(int, b)) for b in loader] == [[1, 3], [5, 7], [9]]
    list(loader)
    assert stream.epochs == [0, 1] and (stream.rank, stream.world_size) == (1, 2)
    assert make_loader(Stream(), 2, num_workers=1, distributed=False).persistent_workers is False


def test_iterable_dataset_takes_shuffle_and_seed_or_refuses_them():
    class Shuffled(Stream):
        shuffle, seed = True, 0

    stream = Shuffled()
    make_loader(stream, 2, num_workers=0)
    assert (stream.shuffle, stream.seed) == (True, 0)  # left out: the dataset keeps its own
    make_loader(stream, 2, num_workers=0, shuffle=False, seed=7)
    assert (stream.shuffle, stream.seed) == (False, 7)
    with pytest.raises(OptionError, match="Stream is an IterableDataset without a shuffle or seed .*shuffle=True"):
        make_loader(Stream(), 2, shuffle=True, seed=1)
    with pytest.raises(OptionError, match="without a seed attribute.*seed=3"):
        make_loader(Stream(), 2, seed=3)


@pytest.mark.parametrize("options, name", [
    ({"num_workers": -1}, "num_workers"),
    ({"num_workers": "many"}, "num_workers"),
    ({"num_workers": 0, "prefetch_factor": 2}, "prefetch_factor"),
    ({"num_workers": 0, "persistent_workers": True}, "persistent_workers"),
    ({"pin_memory": "yes"}, "pin_memory"),
    ({"distributed": "yes"}, "distributed"),
    ({"seed": -3}, "seed"),
])
def test_bad_options_name_the_option(dataset, options, name):
    with pytest.raises(OptionError, match=name):
        make_loader(dataset, 4, **options)


def test_auto_warns_when_an_epoch_starts_unsplit_though_the_environment_says_several_ranks(dataset, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = make_loader(dataset, 8, num_workers=0)  # the process group may come before the first epoch
    with pytest.warns(UserWarning, match="WORLD_SIZE=2 .* no torch.distributed process group.*distributed=False"):
        assert sorted(labels_of(loader)) == list(range(37))  # not split: a single process, as the warning says
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        labels_of(loader)  # once per loader
        monkeypatch.setenv("WORLD_SIZE", "1")
        labels_of(make_loader(dataset, 8, num_workers=0))
        monkeypatch.setenv("WORLD_SIZE", "2")
        labels_of(make_loader(dataset, 8, num_workers=0, distributed=False))


def test_bad_batch_size_and_missing_process_group(dataset, monkeypatch):
    with pytest.raises(OptionError, match=r"^batch_size must be an integer >= 1, not 0$"):  # no "auto" offered
        make_loader(dataset, 0)
    with pytest.raises(OptionError, match=r"^num_workers must be 'auto' or an integer >= 0, not True$"):
        make_loader(dataset, 4, num_workers=True)
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(OptionError, match="init_process_group"):
        make_loader(dataset, 4, distributed=True)


def test_dataset_errors_reach_the_training_loop():
    class Broken(ArrayDataset):
        def get_batch(self, indices):
            raise KeyError("record 3 is gone")

    loader = make_loader(Broken(random_images(8)), 4, read_ahead=True)
    assert loader.pixfeed_plan.read_ahead
    with pytest.raises(KeyError, match="record 3"):
        list(loader)
