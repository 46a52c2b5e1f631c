"""GEMM efficiency over shapes: the optional gemm_shape_factor (rows x sqrt(k n)) of a device profile."""

from __future__ import annotations

import pytest

from piper_sim.errors import ConfigError
from piper_sim.workload.flops import Gemm
from piper_sim.workload.profile_load import load_profile
from piper_sim.workload.roofline import gemm_time_s

BASE = {
    "name": "t",
    "device": "t",
    "peak_bf16_TFLOPS": 100,
    "hbm_GiB": 64,
    "hbm_bandwidth_GBps": 1e6,
    "gemm_efficiency": {"rows": [1, 1024], "efficiency": [0.8, 0.8]},
    "attention_efficiency": {"seq_len": [1, 4096], "efficiency": [0.5, 0.5]},
}
TABLE = {"rows": [256, 4096], "width": [1024, 4096], "factor": [[0.25, 1.0], [0.5, 1.0]]}


def test_without_a_table_every_width_takes_the_rows_curve():
    p = load_profile(BASE)
    assert p.gemm_shape_factor is None
    assert p.gemm_efficiency_at(1024, 128, 128) == p.gemm_efficiency_at(1024, 8192, 8192) == 0.8


def test_the_factor_is_bilinear_in_log2_and_flat_beyond_the_edges():
    p = load_profile({**BASE, "gemm_shape_factor": TABLE})
    assert p.gemm_efficiency_at(256, 1024, 1024) == pytest.approx(0.8 * 0.25)
    assert p.gemm_efficiency_at(4096, 8192, 8192) == pytest.approx(0.8)  # wider than the table: 1
    assert p.gemm_efficiency_at(16, 512, 512) == pytest.approx(0.8 * 0.25)  # below both edges: the corner
    assert p.gemm_efficiency_at(1024, 2048, 2048) == pytest.approx(0.8 * (0.375 + 1.0) / 2)  # the middle
    assert p.gemm_efficiency_at(1024, 1024, 4096) == p.gemm_efficiency_at(1024, 2048, 2048)  # width sqrt(k n)
    narrow, wide = Gemm(1024, 1024, 1024), Gemm(1024, 4096, 4096)
    assert gemm_time_s(p, narrow, 2) / narrow.flops > gemm_time_s(p, wide, 2) / wide.flops


@pytest.mark.parametrize(
    "bad",
    [
        {"rows": [256], "width": [1024], "factor": [[1.5]]},
        {"rows": [4096, 256], "width": [1024], "factor": [[1.0], [1.0]]},
        {"rows": [256], "width": [1024, 2048], "factor": [[1.0]]},
        {"rows": [256], "width": [1024]},
    ],
)
def test_a_malformed_table_is_an_error(bad):
    with pytest.raises(ConfigError, match="gemm_shape_factor"):
        load_profile({**BASE, "gemm_shape_factor": bad})


def test_the_shipped_gpu_profiles_price_skinny_expert_gemms_below_wide_ones():
    for name in ("mi250x", "h100", "a100"):
        p = load_profile(name)
        assert p.gemm_efficiency_at(6144, 2048, 1408) < p.gemm_efficiency_at(6144, 8192, 8192)


def test_one_value_interpolation_is_numpys():
    """profile.interp (the curves' and the shape factor's one-value lookup) gives np.interp's value exactly, on the
    grid's points, between them and beyond both ends."""
    import numpy as np

    from piper_sim.workload.profile import interp

    rng = np.random.default_rng(0)
    xp = np.sort(rng.uniform(0, 14, size=7))
    fp = rng.uniform(0.05, 0.95, size=7)
    for x in [*xp, *rng.uniform(-2, 16, size=500)]:
        assert interp(float(x), tuple(xp.tolist()), tuple(fp.tolist())) == float(np.interp(x, xp, fp))


@pytest.mark.parametrize("name", ["mi250x", "h100", "a100", "mi250x-xmoe", "cpu-8rank"])
def test_many_row_counts_are_priced_as_each_alone(name):
    """gemm_time_s over an array of row counts (skewed routing prices thousands of expert row counts at once) gives
    each count's price alone, below, inside and beyond the curves' points."""
    import numpy as np

    p = load_profile(name)
    rows = np.array([0, 1, 3, 16, 100, 777, 1024, 4095, 70000])
    for k, n in ((2048, 1408), (5120, 20480), (64, 64)):
        many = gemm_time_s(p, Gemm(rows, k, n, count=2), 2)
        alone = [gemm_time_s(p, Gemm(int(r), k, n, count=2), 2) for r in rows]
        assert many.tolist() == pytest.approx(alone, rel=1e-14, abs=0)


@pytest.mark.parametrize("model_name", ["x-moe-small", "deepseek-v3", "mixtral-8x7b"])
def test_an_experts_op_is_priced_as_its_work(model_name):
    """TaskCoster prices an experts op per expert (each row count's GEMMs once): the same seconds and FLOPs as
    work_time_s over the op's whole work (op_work), for every kind of task and uneven rows with empty experts."""
    import numpy as np

    from piper_sim.workload.cost import TaskCoster
    from piper_sim.workload.flops import op_work
    from piper_sim.workload.presets import load_model
    from piper_sim.workload.roofline import BACKWARD_FACTOR, work_time_s

    model, profile = load_model(model_name), load_profile("mi250x")
    coster = TaskCoster(model, profile, 4096)
    rng = np.random.default_rng(1)
    for _ in range(40):
        rows = tuple(int(r) for r in rng.choice([0, 1, 7, 100, 513, 2048, 4096], size=int(rng.integers(1, 17))))
        work = op_work(model, "experts:2", 4096, rows)
        for kind in ("forward_expert", "backward_expert", "recompute_expert", "backward_weight"):
            seconds, flops = coster.cost(kind, ("experts:2",), rows)
            factor = BACKWARD_FACTOR[kind]
            assert seconds == pytest.approx(work_time_s(coster.profile, work, model.dtype_bytes, kind=kind), rel=1e-12)
            assert flops == pytest.approx(factor * work.flops, rel=1e-12)


@pytest.mark.parametrize("name", ["a100", "h100", "mi250x", "mi250x-xmoe", "h200", "b200", "gb200", "mi300x"])
def test_every_gemm_rows_point_of_a_shipped_profile_is_in_its_sources_file(name):
    """Each point of the rows curve is listed, with the same value, in traces/profiles/sources/NAME.yaml as
    measured or derived (never assumed or fitted)."""
    import yaml

    from piper_sim.paths import data_dir

    listed = yaml.safe_load((data_dir("traces/profiles") / "sources" / f"{name}.yaml").read_text())
    points = {p["rows"]: p for p in listed["gemm_efficiency"]["points"]}
    curve = load_profile(name).gemm_efficiency
    for rows, value in zip(curve.x, curve.efficiency, strict=True):
        assert points[rows]["value"] == pytest.approx(value, abs=5e-4), (name, rows)
        assert points[rows]["status"] in ("measured", "derived"), (name, rows)
