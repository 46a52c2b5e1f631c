"""What a size means in `study all-to-all`: each GPU's whole buffer by default (nccl-tests' `size`), the bytes per GPU
pair with --size-per pair, one MoE layer's buffer with --model; and the convention written into the tables."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from piper_sim.cli import main
from piper_sim.errors import ConfigError
from piper_sim.studies.all_to_all import StudySpec, run_study
from piper_sim.studies.model_size import moe_buffer, size_label

MIB = 2**20


def study(tmp_path, *args: str) -> tuple[pd.DataFrame, pd.DataFrame, str, dict]:
    out = tmp_path / "study"
    assert (
        main(
            [
                "study",
                "all-to-all",
                "--topology",
                "uniform",
                "--nodes",
                "2",
                "--algorithms",
                "flat",
                *args,
                "--out",
                str(out),
            ]
        )
        == 0
    )
    return (
        pd.read_csv(out / "study.csv"),
        pd.read_csv(out / "link_kinds.csv"),
        (out / "tables.md").read_text(),
        yaml.safe_load((out / "study.yaml").read_text()),
    )


def test_a_size_is_each_gpus_whole_buffer_by_default(tmp_path):
    """2 nodes x 8 GPUs, 1 MiB: each GPU sends 1/16 MiB to each of the 15 others, 15/16 MiB in all. Every flow
    leaves its GPU on one link (to the node switch or to its NIC) and enters the other on one, so those links
    carry twice the 16 x 15/16 MiB sent."""
    rows, kinds, _, _ = study(tmp_path, "--sizes", "1MiB")
    row = rows.iloc[0]
    assert row["size_per"] == "gpu" and row["bytes_per_gpu"] == MIB and row["bytes_per_pair"] == MIB / 16
    by_kind = kinds.set_index("link_kind")["bytes"]
    assert by_kind["intra"] + by_kind["gpu_nic"] == pytest.approx(2 * 16 * MIB * 15 / 16, rel=1e-12)


def test_a_size_per_pair_is_the_gpu_count_times_a_size_per_gpu():
    """16 GPUs: 64 KiB per pair is the 1 MiB per GPU all-to-all, to the bit."""

    def row(size: str, per: str) -> dict:
        spec = StudySpec(topology="uniform", nodes=(2,), sizes=(size,), algorithms=("flat",), size_per=per)
        return next(run_study(spec, log=lambda _s: None))[0]

    pair, gpu = row("64KiB", "pair"), row("1MiB", "gpu")
    assert pair["bytes_per_gpu"] == gpu["bytes_per_gpu"] == MIB and pair["bytes_per_pair"] == 64 * 2**10
    assert pair["time_s"] == gpu["time_s"] and pair["busbw_bytes_per_s"] == gpu["busbw_bytes_per_s"]
    assert row("1MiB", "pair")["bytes_per_gpu"] == 16 * MIB


@pytest.mark.parametrize(
    ("model", "mbs", "seq", "expected"),
    [
        ("x-moe-small", None, None, 1 * 2048 * 6 * 2048 * 2),  # the preset's seq 2048, top-6, d 2048, bf16
        ("mixtral-8x7b", 2, 1024, 2 * 1024 * 2 * 4096 * 2),  # top-2, d 4096
    ],
)
def test_model_gives_one_moe_layers_buffer(model, mbs, seq, expected):
    buffer = moe_buffer(model, mbs, seq)
    assert buffer.buffer_bytes == expected
    assert buffer.tokens_per_microbatch == (mbs or 1) * (seq or 2048)


def test_the_cli_studies_the_models_buffer_and_records_its_inputs(tmp_path):
    rows, _, _, meta = study(tmp_path, "--model", "x-moe-small")
    assert rows["size"].tolist() == ["48MiB"] and rows["bytes_per_gpu"].tolist() == [48 * MIB]
    assert meta["moe_buffer"] == {
        "model": "x-moe-small",
        "micro_batch_size": 1,
        "seq_len": 2048,
        "tokens_per_microbatch": 2048,
        "top_k": 6,
        "num_experts": 64,
        "d_model": 2048,
        "bytes_per_element": 2,
        "buffer_bytes": 48 * MIB,
    }


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["--model", "x-moe-small", "--sizes", "1MiB"], "--sizes"),
        (["--model", "x-moe-small", "--size-per", "pair"], "--size-per"),
        (["--seq-len", "512"], "--seq-len"),
        (["--model", "x-moe-small", "--micro-batch-size", "0"], "--micro-batch-size"),
    ],
)
def test_size_options_that_do_not_go_together_are_refused(tmp_path, capsys, args, key):
    out = tmp_path / "never"
    assert main(["study", "all-to-all", "--topology", "uniform", "--nodes", "1", *args, "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith(f"piper-sim: error: {key}:") and not out.exists()


@pytest.mark.parametrize(("per", "words"), [("gpu", "per GPU"), ("pair", "per GPU pair")])
def test_the_tables_name_the_size_convention(tmp_path, per, words):
    rows, _, tables, meta = study(tmp_path, "--sizes", "1MiB", "--size-per", per)
    speedup = tables.split("\n\n")[1].splitlines()[0]  # the first table's header row
    assert f"| size {words} |" in speedup
    assert meta["size_per"] == per and meta["size_meaning"] == words and rows["size_per"].tolist() == [per]


def test_size_labels_parse_back_to_the_bytes():
    from piper_sim.studies.all_to_all import parse_size

    for size in (48 * MIB, 3 * 2**30, 96 * 2**10, 1000, 7 * 2**20 + 512):
        assert parse_size(size_label(size)) == size
    with pytest.raises(ConfigError):
        moe_buffer("x-moe-small", seq_len=-1)


def test_reproduces_halo_table_names_its_sizes_per_gpu(tmp_path):
    """reproduce's HALO experiment runs the study per GPU; its table's size column says so."""
    from piper_sim.reproduce.network_experiments import halo_section
    from piper_sim.reproduce.work import run_point

    payload = {
        "kind": "a2a_study",
        "nodes": 1,
        "sizes": ["1MiB"],
        "algorithms": ["rccl", "halo"],
        "topology": "frontier",
    }
    result = run_point(payload)
    assert {row["size_per"] for row in result["rows"]} == {"gpu"}
    table = halo_section([(payload, result)], tmp_path).table
    assert "size per GPU" in table.columns and table["size per GPU"].tolist() == ["1MiB"]
