import pytest
import torch

from engine import DataLoaderConfig


class TestValidation:
    @pytest.mark.parametrize(
        ("kwargs", "error", "match"),
        [
            ({"batch_size": 0}, ValueError, r"^batch_size should be a positive integer, but got batch_size=0$"),
            ({"batch_size": 2.5}, TypeError, r"batch_size should be a positive integer, but got batch_size=2.5"),
            ({"num_workers": -1}, ValueError, r"num_workers should be a non-negative integer, but got num_workers=-1"),
            ({"prefetch_factor": 0}, ValueError, r"prefetch_factor should be a positive integer"),
            ({"seed": -3}, ValueError, r"seed should be a non-negative integer"),
            ({"shuffle": "yes"}, TypeError, r"shuffle should be a bool"),
            ({"pin_memory": 1}, TypeError, r"pin_memory should be True, False or None"),
            ({"persistent_workers": True}, ValueError, r"persistent_workers=True needs worker processes"),
            ({"collate_fn": 3}, TypeError, r"collate_fn should be callable"),
            ({"timeout": -1}, ValueError, r"timeout should be a number >= 0"),
            ({"multiprocessing_context": "thread"}, ValueError, r"multiprocessing_context should be one of"),
        ],
    )
    def test_bad_values_name_the_field(self, kwargs, error, match):
        with pytest.raises(error, match=match):
            DataLoaderConfig(**kwargs)


class TestResolve:
    def test_no_workers_means_no_prefetch_and_no_persistence(self):
        kwargs, reasons = DataLoaderConfig(num_workers=0, prefetch_factor=4).resolve()
        assert kwargs["prefetch_factor"] is None
        assert kwargs["persistent_workers"] is False
        assert "only with workers" in reasons["prefetch_factor"]

    def test_workers_keep_prefetch_and_persist_by_default(self):
        kwargs, _ = DataLoaderConfig(num_workers=2, prefetch_factor=3).resolve()
        assert kwargs["prefetch_factor"] == 3
        assert kwargs["persistent_workers"] is True

    def test_explicit_persistent_false_is_kept(self):
        kwargs, reasons = DataLoaderConfig(num_workers=2, persistent_workers=False).resolve()
        assert kwargs["persistent_workers"] is False
        assert "was given" in reasons["persistent_workers"]

    def test_pin_memory_follows_cuda(self):
        kwargs, _ = DataLoaderConfig().resolve()
        assert kwargs["pin_memory"] is torch.cuda.is_available()

    @pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
    def test_pin_memory_true_without_cuda_warns_and_does_not_pin(self):
        config = DataLoaderConfig(pin_memory=True)
        with pytest.warns(UserWarning, match="no CUDA device; not pinning"):
            kwargs, _ = config.resolve()
        assert kwargs["pin_memory"] is False
        assert config.pin_memory is True  # the user's config is not changed


class TestDrawnSeed:
    """seed=None draws one seed when the config is made and records it, so the sampler, the workers and the config
    agree on it (not 0 for the order and another for the workers)."""

    def test_none_draws_a_seed_once_and_records_it(self, monkeypatch):
        import secrets

        monkeypatch.setattr(secrets, "randbits", lambda bits: 1234)
        config = DataLoaderConfig(batch_size=4, shuffle=True, seed=None)
        assert config.seed == 1234

    def test_the_training_and_eval_samplers_use_the_recorded_seed(self):
        from engine import DataLoaderFactory

        config = DataLoaderConfig(batch_size=4, shuffle=True, seed=None)
        assert isinstance(config.seed, int) and 0 <= config.seed < 2**31
        data = torch.utils.data.TensorDataset(torch.arange(10))
        factory = DataLoaderFactory()
        assert factory.train_dataloader(data, config).batch_sampler.seed == config.seed
        assert factory.eval_dataloader(data, config).batch_sampler.seed == config.seed
        again = DataLoaderConfig(batch_size=4, shuffle=True, seed=config.seed)
        assert ([b[0].tolist() for b in factory.train_dataloader(data, config)]
                == [b[0].tolist() for b in factory.train_dataloader(data, again)])
