"""`resdecay alpha --json`: stdout is one JSON document, messages go to stderr (issue 13, bug 2)."""

import json

import pytest

from helpers import run


@pytest.mark.parametrize("how", [["--alpha-min", "0.7"], ["--target-eff", "5e-3"]])
def test_alpha_json_stdout_is_json_alone(capsys, tmp_path, how):
    png = tmp_path / "a.png"
    code, out, err = run(capsys, "alpha", "--depth", "12", *how, "--json", "--out", str(png))
    assert code == 0, err
    data = json.loads(out)  # the whole of stdout
    assert len(data["alphas"]) == 12 and 0 < data["alpha_eff"] < 1
    assert f"plot: {png}" in err and png.is_file()


def test_alpha_table_still_prints_plot_line_on_stdout(capsys, tmp_path):
    code, out, _ = run(capsys, "alpha", "--depth", "4", "--alpha-min", "0.7", "--out", str(tmp_path / "a.png"))
    assert code == 0 and "plot: " in out and "alpha_eff" in out
