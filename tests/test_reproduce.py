"""docs/reproduce.md and the pipeline it runs: a row per paper whose configs exist, linked first from the README;
`experiments/egpo/reproduce.yaml` feeds the datagen stage's samples to the egpo stage (`--dry-run` resolves both)."""

import re
from pathlib import Path

import pytest

from palaestra.shared.jobs import load_config
from palaestra.shared.pipeline import stage_configs

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "reproduce.md"
PAPERS = ("HardGen", "FunReason-MT", "EGPO", "MARS", "AED")


def test_the_egpo_stage_reads_what_the_datagen_stage_writes(tmp_path):
    cfg = load_config(ROOT / "experiments" / "egpo" / "reproduce.yaml", [f"output_dir={tmp_path}"])
    stages = stage_configs(cfg)
    assert list(stages) == ["datagen", "egpo"]  # the order they run in
    written = stages["datagen"].output_path
    multi_turn = [env for env in stages["egpo"].envs if env.name == "datagen_multi_turn"]
    assert len(multi_turn) == 1 and Path(multi_turn[0].kwargs["path"]) == written
    assert written.is_relative_to(tmp_path) and Path(stages["egpo"].output_dir) == tmp_path / "egpo"
    # control: the paper config alone reads the fixed path that datagen's own config writes
    alone = load_config(ROOT / "experiments" / "egpo" / "qwen3_4b_bfcl.yaml")
    fixed = [env.kwargs["path"] for env in alone.envs if env.name == "datagen_multi_turn"]
    assert fixed == ["outputs/datagen/llm_served/samples.jsonl"] and Path(fixed[0]) != written


def test_the_guide_has_a_row_per_paper_with_configs_that_exist():
    text = GUIDE.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| **")]
    assert [re.match(r"\| \*\*([^*]+)\*\*", row)[1] for row in rows] == list(PAPERS)
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 6 and all(cells), row[:60]
        configs = re.findall(r"\]\(\.\./(experiments/[^)]+\.yaml)\)", cells[2])
        assert configs and all((ROOT / c).is_file() for c in configs), cells[2]
    for link in re.findall(r"\]\(\.\./([^)#]+)\)", text):
        assert (ROOT / link).exists(), link


def test_the_readme_links_the_guide_first():
    links = re.findall(r"\]\(([^)]+)\)", (ROOT / "README.md").read_text())
    assert links and links[0] == "docs/reproduce.md"


def test_plan_covers_both_stages():
    """`palaestra plan` of the pipeline plans each stage: the teacher's load, then the 8-GPU layout."""
    from palaestra.shared.plan import plan_config

    report, fits = plan_config(load_config(ROOT / "experiments" / "egpo" / "reproduce.yaml"))
    assert fits
    datagen, egpo = report.index("stage datagen (datagen.generate)"), report.index("stage egpo (egpo.train)")
    assert datagen < report.index("expected LLM load for 2,000 items") < egpo
    assert "GPUs: 8 learner + vLLM colocated (each holds both) = 8 of 8" in report[egpo:]
    assert "layout node8_colocated: 80 GB GPUs fit, 141 GB GPUs fit" in report[egpo:]


def test_the_mars_mas_stage_reads_the_train_stages_last_checkpoint(tmp_path):
    stages = stage_configs(load_config(ROOT / "experiments" / "mars" / "reproduce.yaml", [f"output_dir={tmp_path}"]))
    train, mas = stages["train"], stages["mas"]
    checkpoint = Path(train.output_dir) / "checkpoints" / f"step_{train.steps:06d}"  # the trainer's layout
    assert train.steps == 200 and Path(mas.trained_llm.model) == checkpoint
    assert mas.llm.model == train.llm.model == "Qwen/Qwen3-4B"  # the base beside it is the model it started from


@pytest.mark.parametrize("config", ["datagen/llm_served.yaml", "aed/paper.yaml"])
def test_the_served_llm_configs_plan_their_one_gpu_layout(config):
    """The teacher (datagen) and the reward designer and judge (AED) run on a served model: `palaestra plan`
    gives its one-GPU layout, weights + KV cache within vLLM's share of each GPU size (a closed form here)."""
    from palaestra.shared.plan import plan_config
    from palaestra.shared.plan_memory import VLLM_OVERHEAD_GB

    report, _ = plan_config(load_config(ROOT / "experiments" / config))
    lines = report[report.index("served LLM Qwen/Qwen3-4B-Instruct-2507: one GPU") :].splitlines()
    weights = 4.02 * 2  # the hub config's 4.02B parameters in bf16, GB
    for gb, line in zip((80, 141), lines[1:3]):
        assert line.startswith(f"  {gb} GB GPU: weights {weights:.2f} + KV cache ") and line.endswith("fits")
        kv = float(line.split("KV cache ")[1].split(" GB")[0])
        assert kv == pytest.approx(0.9 * gb - weights - VLLM_OVERHEAD_GB, abs=0.01)  # vLLM's 0.9, less its own


def test_a_served_model_of_unknown_shape_says_so_in_one_line():
    from palaestra.shared.llm.base import LLMConfig
    from palaestra.shared.plan_layout import served_plan_lines

    assert served_plan_lines(LLMConfig(model="tiny")) == []  # in process: nothing served
    (line,) = served_plan_lines(LLMConfig(backend="openai", model="someone/unknown-model"))
    assert line.startswith("served LLM someone/unknown-model: no one-GPU figures (") and "\n" not in line
