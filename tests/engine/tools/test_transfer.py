from collections import OrderedDict, namedtuple

import pytest
import torch

from engine.tools.transfer import move_to_device, use_non_blocking

Pair = namedtuple("Pair", ["inputs", "target"])


def nested_batch():
    return {
        "input_ids": torch.arange(6).reshape(2, 3),
        "extras": [torch.ones(2), ("name", torch.zeros(1, dtype=torch.float16))],
        "pair": Pair(torch.ones(2, 2), torch.tensor([0, 1])),
        "meta": {"count": 3, "tag": None},
    }


class TestCpuPath:
    @pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
    def test_tensors_come_back_unchanged_as_the_same_objects(self, device):
        batch = nested_batch()
        moved = move_to_device(batch, device)
        assert moved["input_ids"] is batch["input_ids"]
        assert moved["extras"][0] is batch["extras"][0] and moved["extras"][1][1] is batch["extras"][1][1]
        assert moved["pair"].inputs is batch["pair"].inputs and moved["pair"].target is batch["pair"].target
        assert moved["meta"] == {"count": 3, "tag": None} and moved["extras"][1][0] == "name"

    def test_container_types_are_kept_and_the_callers_batch_is_not_mutated(self):
        batch = nested_batch()
        batch["ordered"] = OrderedDict(a=torch.ones(1))
        moved = move_to_device(batch, "cpu")
        assert moved is not batch and moved["extras"] is not batch["extras"]
        assert type(moved["extras"]) is list and type(moved["extras"][1]) is tuple
        assert type(moved["pair"]) is Pair and type(moved["ordered"]) is OrderedDict
        assert set(batch) == {"input_ids", "extras", "pair", "meta", "ordered"}

    def test_nothing_is_pinned_and_dtypes_are_kept(self):
        moved = move_to_device(nested_batch(), "cpu", non_blocking=True)
        tensors = [moved["input_ids"], moved["extras"][0], moved["extras"][1][1], *moved["pair"]]
        assert not any(tensor.is_pinned() for tensor in tensors)
        assert moved["extras"][1][1].dtype == torch.float16 and moved["input_ids"].dtype == torch.int64

    def test_a_bare_tensor_and_non_tensor_leaves(self):
        tensor = torch.ones(3)
        assert move_to_device(tensor, "cpu") is tensor
        assert move_to_device("text", "cpu") == "text" and move_to_device(None, "cpu") is None


class TestNonBlockingRule:
    @pytest.mark.parametrize(("pinned", "device", "non_blocking", "expected"), [
        (True, "cuda", None, True),
        (True, "cuda", True, True),
        (True, "cuda", False, False),
        (False, "cuda", None, False),
        (False, "cuda", True, False),  # pageable memory: the copy is synchronous anyway
        (True, "cpu", None, False),
        (True, "cpu", True, False),  # never non-blocking towards the host
    ])
    def test_only_pinned_sources_to_cuda(self, pinned, device, non_blocking, expected):
        assert use_non_blocking(pinned, torch.device(device), non_blocking) is expected


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
class TestCuda:
    def test_pinned_batch_moves_asynchronously_and_arrives_equal(self):
        batch = {"x": torch.arange(8.0).pin_memory(), "y": [torch.ones(2)]}
        moved = move_to_device(batch, "cuda")
        torch.cuda.synchronize()
        assert moved["x"].is_cuda and moved["y"][0].is_cuda
        assert torch.equal(moved["x"].cpu(), batch["x"]) and torch.equal(moved["y"][0].cpu(), batch["y"][0])
