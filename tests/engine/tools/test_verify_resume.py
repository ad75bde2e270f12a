"""verify_resume and ``python -m engine verify-resume``: plain, packed and mixture configurations pass, exactly and
from 2 simulated ranks to 1 (and 1 to 2); a collator whose randomness ignores the seed, and one whose random state
restarts with its worker on resume, are caught at the first differing step with the key that differs; the command
line reads a script's module and exits 0 or 1."""

import textwrap

import pytest
import torch

from engine.__main__ import main
from engine.tools.verify_resume import compare, digest, load_script, verify_resume
from tests.engine import test_mixture_module, test_packed_module
from tests.engine.test_resume import module


class UnseededNoise:
    """A collator that adds a column drawn from torch's global generator: the batches change from run to run."""

    def __call__(self, rows):
        ids = torch.nn.utils.rnn.pad_sequence([row["input_ids"] for row in rows], batch_first=True)
        return {"input_ids": ids, "noise": torch.randint(0, 1000, (len(rows),))}


class OwnGenerator:
    """A collator with its own generator, seeded once and drawn from on every batch: each worker's copy repeats
    its draws in every run, but a resumed run's workers start their draws again from the first."""

    def __init__(self):
        self.generator = torch.Generator().manual_seed(0)

    def __call__(self, rows):
        ids = torch.nn.utils.rnn.pad_sequence([row["input_ids"] for row in rows], batch_first=True)
        return {"input_ids": ids, "noise": torch.randint(0, 1000, (len(rows),), generator=self.generator)}


class TestPasses:
    def test_a_plain_module_resumes_exactly_and_on_other_ranks(self):
        check = module(0).verify_resume(steps=8, at=3)
        assert check.passed and check.difference is None
        assert check.reference == check.resumed and len(check.reference) == 8
        elastic = check.elastic
        assert (elastic.world, elastic.to_world, elastic.epoch) == (2, 1, 0)
        assert elastic.rows == 40 and elastic.served_before == 2 * 3 * 4  # 40 rows after val_split=5
        assert elastic.served_before + elastic.served_after >= elastic.rows

    def test_the_module_given_is_not_iterated(self):
        dm = module(0)
        verify_resume(dm, steps=4, world=None, to_world=None)
        assert dm.data_state()["train_loader"] is None  # no train loader was built, so none was iterated

    def test_with_worker_processes(self):
        assert module(2).verify_resume(steps=6, at=2, world=1, to_world=2).passed

    def test_packed(self):
        check = test_packed_module.module(0).verify_resume(steps=6, at=4, world=2, to_world=1)
        assert check.passed, check.table()
        assert check.elastic.rows == 55  # every document of the epoch: 60 rows less val_split=5

    def test_mixture(self):
        check = test_mixture_module.module().verify_resume(steps=12, at=5, world=2, to_world=1)
        assert check.passed, check.table()


class TestCaught:
    def test_randomness_that_ignores_the_seed_is_named_at_the_first_step(self):
        check = module(0, collate_fn=UnseededNoise()).verify_resume(steps=4, at=2, world=None, to_world=None)
        assert not check.passed
        difference = check.difference
        assert (difference.step, difference.phase) == (0, "before the save")
        assert difference.values == ("noise",) and not difference.keys and not difference.shapes
        assert "DIFFERS" in check.table() and "FAILED, first difference at step 0 (before the save)" in check.table()

    def test_random_state_that_restarts_on_resume_is_named_at_the_first_step_after_the_load(self):
        check = module(2, collate_fn=OwnGenerator()).verify_resume(steps=6, at=3, world=None, to_world=None)
        assert not check.passed
        assert check.reference[:3] == check.resumed[:3]
        assert (check.difference.step, check.difference.phase, check.difference.values) == (3, "after the resume",
                                                                                             ("noise",))

    def test_an_elastic_resume_that_serves_rows_again_is_caught(self, monkeypatch):
        """A broken elastic rule: the rest of the epoch keeps the rows served before the save."""
        monkeypatch.setattr("engine.sampling.elastic.remaining_order",
                            lambda sampler, epoch, segments: sampler.epoch_order(epoch))
        check = module(0).verify_resume(steps=4, at=2, world=2, to_world=1)
        assert check.difference is None and not check.passed  # exact on the same ranks; not on others
        assert len(check.elastic.repeated) == check.elastic.served_before == 16
        assert "FAILED, 16 rows repeated" in check.table()

    def test_token_budget_padding_with_whole_batches_is_not_a_repeat(self):
        check = module(0, batching="token_budget", max_tokens=96, batch_size=None).verify_resume(
            steps=6, at=2, world=2, to_world=4)
        assert check.passed, check.table()
        assert check.elastic.served_before + check.elastic.served_after > check.elastic.rows  # padded

    def test_keys_and_shapes_that_differ_are_named(self):
        ours = digest({"input_ids": torch.zeros(2, 3), "labels": torch.zeros(2)})
        theirs = digest({"input_ids": torch.zeros(2, 4), "extra": torch.zeros(1)})
        found = compare(5, "after the resume", ours, theirs)
        assert found.keys == ("extra", "labels")
        assert found.shapes == ("input_ids: torch.float32[2, 3] vs torch.float32[2, 4]",)
        assert str(found).startswith("step 5 (after the resume): keys ['extra', 'labels']; shapes")


class TestRefused:
    @pytest.mark.parametrize(("options", "match"), [
        ({"steps": 4, "at": 4}, r"at should be a step before steps=4 .* but got at=4"),
        ({"steps": 1}, "steps should be"),
        ({"world": 3, "to_world": 1}, r"world should divide the global batch \(batch_size=8 x 1 ranks = 8\).* "
                                      r"but got world=3"),
        ({"world": 2, "to_world": None}, "world and to_world should be given together"),
    ])
    def test_bad_arguments(self, options, match):
        with pytest.raises((ValueError, TypeError), match=match):
            verify_resume(module(0), **options)


SCRIPT = """
from engine import UniversalDataModule
from tests.engine.test_resume import SPEC, rows
from tests.engine.tools.test_verify_resume import UnseededNoise

def make_datamodule():
    return UniversalDataModule(rows(), task_spec=SPEC, batch_size=8, seed=3{extra})

if __name__ == "__main__":
    raise SystemExit("the training loop must not run")
"""


class TestCommandLine:
    def test_a_script_that_resumes_exactly_exits_0(self, tmp_path, capsys):
        script = tmp_path / "train.py"
        script.write_text(SCRIPT.format(extra=""))
        assert main(["verify-resume", str(script), "--steps", "4", "--at", "1"]) == 0
        out = capsys.readouterr().out
        assert "exact resume at step 1 of 4: passed" in out and "elastic resume 2 -> 1 ranks" in out

    def test_a_script_that_does_not_exits_1_naming_the_step(self, tmp_path, capsys):
        script = tmp_path / "train.py"
        script.write_text(SCRIPT.format(extra=", collate_fn=UnseededNoise()"))
        assert main(["verify-resume", str(script), "--steps", "3", "--world", "0"]) == 1
        out = capsys.readouterr().out
        assert "FAILED, first difference at step 0 (before the save): values of ['noise']" in out
        assert "elastic" not in out

    def test_a_top_level_dm_is_read_too(self, tmp_path):
        script = tmp_path / "train.py"
        script.write_text(textwrap.dedent(SCRIPT.format(extra="")) + "\ndm = make_datamodule()\ndel make_datamodule\n")
        assert load_script(script).seed == 3

    def test_a_script_without_a_module_is_refused_naming_the_convention(self, tmp_path):
        script = tmp_path / "train.py"
        script.write_text("x = 1\n")
        with pytest.raises(ValueError, match=r"should define make_datamodule\(\) .* or a top-level dm"):
            load_script(script)
        with pytest.raises(FileNotFoundError, match="which is not a file"):
            load_script(tmp_path / "missing.py")
