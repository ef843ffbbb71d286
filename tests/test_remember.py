"""What to remember: the stored GPU ladder read for the rules' GPU numbers, never typed in."""
import json

from gantools.workbook.remember import h200_ladder, h200_warmup_s, on_h200


def _evidence(tmp_path, name, rows):
    folder = tmp_path / name
    folder.mkdir()
    ladder = {"config": {"image_size": 64, "batch_size": 128}, "machine": {"device_name": "NVIDIA H200"},
              "rows": rows}
    (folder / "evidence.json").write_text(json.dumps({"parts": [{"name": "ladder", "status": "ok",
                                                                 "result": ladder}]}))


def test_the_warm_up_a_gpu_measured_is_read_from_the_newest_stored_ladder(tmp_path):
    row = {"variant": "torch.compile", "speedup": 0.95, "warmup_s": 22.9, "images_per_sec_runs": [1, 2, 3]}
    _evidence(tmp_path, "gpu-2026-01-01", [{**row, "warmup_s": 40.0}])
    _evidence(tmp_path, "gpu-2026-02-01", [row])
    assert h200_warmup_s("torch.compile", tmp_path) == 22.9  # the newer folder's
    assert h200_warmup_s("fused Adam", tmp_path) is None and h200_warmup_s("torch.compile", tmp_path / "none") is None
    assert on_h200("torch.compile", h200_ladder(tmp_path)).startswith("0.95x the tutorial loop (NVIDIA H200")
    assert h200_ladder(tmp_path)["report"] == "docs/gpu/gpu-2026-02-01"
