"""make_loader's collate: HWC-backed images stacked without a transposing copy."""
import numpy as np
import torch
from torch.utils.data import DataLoader, default_collate

from pixfeed.loaders.collate import collate


def samples(n=5, shape=(6, 7, 3)):
    rng = np.random.default_rng(0)
    return [(torch.from_numpy(rng.integers(0, 255, shape, dtype=np.uint8)).permute(2, 0, 1), i) for i in range(n)]


def test_same_values_as_default_collate_in_channels_last_layout():
    batch = samples()
    images, labels = collate(batch)
    expected = default_collate(batch)
    assert torch.equal(images, expected[0]) and torch.equal(labels, expected[1])
    assert images.shape == (5, 3, 6, 7) and images.is_contiguous(memory_format=torch.channels_last)


def test_other_samples_fall_back_to_default_collate():
    contiguous = [(torch.arange(6, dtype=torch.uint8).reshape(1, 2, 3), 0)] * 2
    assert collate(contiguous)[0].is_contiguous()
    mixed = samples(2) + samples(1, (6, 8, 3))
    mixed[2] = (mixed[2][0][:, :, :7], 2)  # same shape, but not an HWC view any more
    assert torch.equal(collate(mixed)[0], default_collate(mixed)[0])
    assert collate([{"a": 1}, {"a": 2}])["a"].tolist() == [1, 2]


def test_workers_build_the_batch_in_shared_memory():
    loader = DataLoader(samples(8), batch_size=4, num_workers=1, collate_fn=collate)
    batches = list(loader)
    assert [b[1].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert torch.equal(torch.cat([b[0] for b in batches]), default_collate(samples(8))[0])


def test_other_chw_images_are_stacked_straight_into_either_layout():
    floats = [(torch.rand(3, 4, 5), i) for i in range(3)]  # a transform's or a user's dataset's images
    expected = default_collate(floats)[0]
    for memory_format in (torch.channels_last, torch.contiguous_format):
        images, labels = collate(floats, memory_format)
        assert images.is_contiguous(memory_format=memory_format) and torch.equal(images, expected)
        assert labels.tolist() == [0, 1, 2]
    grads = [(torch.rand(3, 4, 5, requires_grad=True), i) for i in range(2)]  # stack(out=) refuses these
    assert torch.equal(collate(grads)[0], default_collate(grads)[0])
