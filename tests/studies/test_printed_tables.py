"""The tables the commands print (analysis/tables.py's style): sweep names each point's GPUs and whether it fits,
the scaling study names the model each point built and says which points are estimates, and its plot starts at 0."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from piper_sim.cli import main  # noqa: E402
from piper_sim.studies.scaling import model_label, scaling_figure, scaling_text  # noqa: E402
from piper_sim.workload.presets import load_model  # noqa: E402


def _rows(text: str) -> tuple[str, list[list[str]]]:
    lines = [line for line in text.splitlines() if line.strip()]
    rule = next(i for i, line in enumerate(lines) if set(line) <= {"-", " "})
    body = []
    for line in lines[rule + 1 :]:
        if line.startswith(("wrote", "sweep:", "...")):
            break
        body.append(line.split())
    return lines[rule - 1], body


def test_sweep_prints_gpus_fits_and_units(tmp_path, capsys):
    code = main(["sweep", "small-moe", "--grid", "parallel.pp=1,2", "--workers", "0", "--out", str(tmp_path)])
    assert code == 0
    header, body = _rows(capsys.readouterr().out)
    for label in ("parallel.pp", "GPUs", "step (ms)", "MFU (%)", "bubble (%)", "peak memory (GiB)", "fits"):
        assert label in header
    table = pd.read_csv(tmp_path / "sweep.csv")
    assert [row[0] for row in body] == ["1", "2"]
    assert [row[1] for row in body] == ["4", "8"]  # small-moe: ep 4, times pp
    assert all("yes" in row for row in body)  # a toy model on 64 GiB devices
    assert [float(row[2]) for row in body] == [round(t * 1e3, 2) for t in table["sim_step_time_s"]]
    assert "e+" not in header + str(body) and "-0.0" not in str(body)
    assert "gpus" not in table.columns and "fits" not in table.columns  # the file keeps its columns


def test_a_built_model_is_named_by_what_it_is():
    section = {"preset": "weak-110b", "num_experts": 128}
    model = load_model(section)
    assert model.name == "weak-110b"
    assert model_label(section, model) == f"weak-110b E128 ({round(model.total_params() / 1e9)}B)"
    assert model.total_params() > 500e9
    assert model_label("x-moe-small", load_model("x-moe-small")) == "x-moe-small (10.9B)"


SCALING = pd.DataFrame(
    [
        {
            "gpus": 256,
            "model": "weak-110b",
            "model_label": "weak-110b E16 (111B)",
            "global_batch": 1024,
            "plan": "pp4 ep8",
            "fits": True,
            "refined": True,
            "step_time_s": 14.76,
            "tflops_per_gpu": 117.9,
            "mfu": 0.616,
            "tokens_per_s": 284105.2,
            "peak_memory_bytes": 4.245450e10,
            "candidates": 5616,
            "scaling_efficiency": 1.0,
        },
        {
            "gpus": 1024,
            "model": "weak-110b",
            "model_label": "weak-110b E128 (863B)",
            "global_batch": 4096,
            "plan": "pp8 ep32",
            "fits": True,
            "refined": False,
            "step_time_s": 18.1,
            "tflops_per_gpu": 96.2,
            "mfu": 0.5026,
            "tokens_per_s": 926562.4,
            "peak_memory_bytes": 4.537104e10,
            "candidates": 7960,
            "scaling_efficiency": 0.816,
        },
    ]
)


def test_scaling_table_names_the_built_model_and_the_tier():
    header, body = _rows(scaling_text(SCALING))
    assert "model" in header and "step (s)" in header and "peak memory (GiB)" in header
    assert body[1][:4] == ["1,024", "weak-110b", "E128", "(863B)"]
    assert "simulated" in body[0] and "estimated" in body[1]
    assert "42.26" in body[1] and "81.6" in body[1]  # 4.537104e10 bytes in GiB; efficiency in %


def test_scaling_plot_starts_at_zero_and_marks_estimates():
    fig = scaling_figure(SCALING, weak=True, context_line="frontier")
    for ax in fig.axes:
        assert ax.get_ylim()[0] == 0
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("estimated" in t for t in legend) and any("simulated" in t for t in legend)
    assert "E128 (863B)" in " ".join(t.get_text() for t in fig.axes[0].get_xticklabels())
    assert "not measurements" in fig._suptitle.get_text()
    plt.close(fig)


def test_plan_table_formats_each_tier():
    from types import SimpleNamespace

    from piper_sim.planning.plan_outputs import format_plan_table

    table = pd.DataFrame(
        [
            {
                "rank": 1,
                "label": "pp2 ep4",
                "fits": True,
                "refined": True,
                "peak_memory_bytes": 40 * 2**30,
                "est_step_time_s": 1.25,
                "sim_step_time_s": 1.5,
                "sim_tflops_per_gpu": 101.26,
                "est_tflops_per_gpu": 120.0,
                "sim_mfu": 0.409409,
                "est_mfu": 0.5,
            },
            {
                "rank": 2,
                "label": "pp4 ep2",
                "fits": True,
                "refined": False,
                "peak_memory_bytes": 30 * 2**30,
                "est_step_time_s": 2.0,
                "sim_step_time_s": float("nan"),
                "sim_tflops_per_gpu": float("nan"),
                "est_tflops_per_gpu": 90.04,
                "sim_mfu": float("nan"),
                "est_mfu": -0.0,
            },
        ]
    )
    header, body = _rows(format_plan_table(SimpleNamespace(table=table)))
    assert header.startswith("rank  plan")
    assert "estimated step (s)" in header and "simulated step (s)" in header and "MFU (%)" in header
    assert body == [
        ["1", "pp2", "ep4", "yes", "40.00", "1.250", "1.500", "101.3", "40.9"],
        ["2", "pp4", "ep2", "yes", "30.00", "2.000", "-", "90.0", "0.0"],
    ]


def test_study_imbalance_prints_its_rows_and_the_drift_run(tmp_path):
    from piper_sim.studies.imbalance import COLUMNS, DRIFT_COLUMNS, tables_text

    pd.DataFrame(
        [["zipf", 1.0, "greedy", 0.03672, 0.0156, 2.98, 1.70, 18, 108 * 2**20, 0.0023]], columns=list(COLUMNS)
    ).to_csv(tmp_path / "imbalance.csv", index=False)
    pd.DataFrame([["lpt", 0, 2.0], ["lpt", 1, 1.0], ["lpt", 2, 1.5]], columns=list(DRIFT_COLUMNS)).to_csv(
        tmp_path / "drift.csv", index=False
    )
    first, drift = tables_text(tmp_path).split("\n\n")
    header, body = _rows(first)
    assert "step (ms)" in header and "moved per EP group (MiB)" in header and "migration share (%)" in header
    assert body == [["zipf", "1.00", "greedy", "36.72", "1.6", "3.0", "1.70", "18", "108.0", "0.23"]]
    header, body = _rows(drift)
    assert header.split() == [
        "migration",
        "steps",
        "step",
        "0",
        "(s)",
        "mean",
        "after",
        "step",
        "0",
        "(s)",
        "last",
        "step",
        "(s)",
    ]
    assert body == [["lpt", "3", "2.000", "1.250", "1.500"]]


def test_study_all_to_all_prints_its_rows_with_the_speedup(tmp_path):
    from piper_sim.studies.collective_plots import study_text

    rows = [
        {
            "nodes": 2,
            "gpus": 16,
            "size": "1MiB",
            "size_per": "gpu",
            "bytes_per_pair": 65536.0,
            "algorithm": alg,
            "time_s": t,
            "busbw_bytes_per_s": 1.048576e6 * 15 / 16 / t,
            "busiest_link_kind": "nic",
            "busiest_utilization": u,
            "note": None,
        }
        for alg, t, u in (("flat", 1.1e-4, 0.554), ("halo", 8.7e-5, 0.625))
    ]
    pd.DataFrame(rows).to_csv(tmp_path / "study.csv", index=False)
    header, body = _rows(study_text(tmp_path))
    assert "size per GPU" in header and "time (us)" in header and "over flat (x)" in header and "note" not in header
    assert body == [
        ["2", "16", "1MiB", "flat", "110.0", "8.9", "1.00", "nic", "55.4"],
        ["2", "16", "1MiB", "halo", "87.0", "11.3", "1.26", "nic", "62.5"],
    ]


def test_validate_prints_its_cases_and_published_runs_as_tables():
    from piper_sim.validation.published import format_families
    from piper_sim.validation.report import _case_table

    phases = pd.DataFrame({"error": [0.05, -0.2]}, index=["forward", "all_to_all"])
    scores = [
        {
            "case": "w1",
            "predicted_step_s": 0.0123,
            "measured_step_s": 0.0131,
            "error": -0.061,
            "tolerance": 0.1,
            "memory_error": float("nan"),
            "measured_spread": 0.04,
            "phases": phases,
        },
        {
            "case": "w2",
            "predicted_step_s": 0.0223,
            "measured_step_s": 0.0191,
            "error": 0.1675,
            "tolerance": 0.1,
            "memory_error": -0.0,
            "measured_spread": float("nan"),
            "phases": phases,
        },
    ]
    header, body = _rows("\n".join(_case_table(scores)))
    assert "predicted step (ms)" in header and "error (%)" in header and "within tolerance" in header
    assert body == [
        ["w1", "12.30", "13.10", "-6.1", "yes", "-", "4", "all_to_all", "-20%"],
        ["w2", "22.30", "19.10", "+16.8", "no", "0.0", "-", "all_to_all", "-20%"],
    ]
    header, body = _rows(
        format_families(
            [
                {
                    "family": "mi250x MoE",
                    "runs": 4,
                    "mape": 0.25,
                    "mean_signed": -0.2,
                    "worst_error": -0.38,
                    "worst": "x-moe-large",
                }
            ]
        )
    )
    assert body == [["mi250x", "MoE", "4", "25.0", "-20.0", "-38.0", "x-moe-large"]]
