"""The bench through Ray (--ray-address local): the same results as the local process pool,
and a rerun resumes from the same folder."""

import dataclasses
import json

import pytest

pytest.importorskip("ray")

from pml_fieldlosses.app import cli  # noqa: E402
from pml_fieldlosses.app.bench import run_bench  # noqa: E402
from pml_fieldlosses.app.bench.result import UNTRAINED  # noqa: E402

from .test_bench import folder, tiny_config  # noqa: E402,F401  (the tiny image folder fixture)

LOSSES = ("ProxyAnchor", "PFML")


def results(out):
    """{(loss, seed): every number of its result.json but the timings}."""
    found = {}
    for path in out.glob("*/runs/*/seed*/result.json"):
        result = json.loads(path.read_text())
        found[path.parent.parent.name, path.parent.name] = {
            k: v for k, v in result.items() if "second" not in k and "time" not in k
        }
    return found


def test_ray_runs_give_the_local_results_and_resume(folder, tmp_path, capsys, local_ray):  # noqa: F811
    local = tiny_config(folder, tmp_path / "local", losses=LOSSES, workers=2)
    on_ray = dataclasses.replace(local, out=str(tmp_path / "ray" / "out"), ray_address="local")
    rows_local = run_bench(local)
    rows_ray = run_bench(on_ray)
    assert [r["loss"] for r in rows_ray] == [r["loss"] for r in rows_local] == [r["loss"] for r in rows_ray]
    assert results(tmp_path / "ray" / "out") == results(tmp_path / "local" / "out")
    assert len(results(tmp_path / "ray" / "out")) == 1 + 2 * len(LOSSES)  # untrained once
    assert {r["loss"] for r in rows_ray} == {UNTRAINED, *LOSSES}
    capsys.readouterr()
    run_bench(on_ray)  # everything finished: nothing is sent to Ray again
    assert "resuming: 5 of 5 runs already finished" in capsys.readouterr().err


def test_cli_takes_the_ray_address():
    parser = cli.argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cli.bench_parser(sub)
    args = parser.parse_args(["bench", "--ray-address", "auto", "--losses", "ProxyAnchor"])
    assert cli.config_from_args(args).ray_address == "auto"
