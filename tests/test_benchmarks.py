"""The benchmark scripts run end to end on tiny sizes (their numbers are for
the docs, measured at full size; nothing here is timed)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_potential_training_prints_a_ratio_per_stage_and_loss():
    args = "--num-classes 40 800 --steps 60 --batch-size 32 --embedding-size 16 --input-size 16 --window 3 --threads 1"
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_potential_training.py"), *args.split()],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    for C in (40, 800):
        for name in ("PFML", "CPML"):
            # the table's line (each window's cell is also printed alone as it closes)
            (line,) = [
                line for line in out.splitlines() if re.match(rf"N={C}\s+{name}\s+start.*\| end", line)
            ]
            ratios = re.findall(r"vs\s+[0-9]+ ms x\s*([0-9.]+)", line)
            assert len(ratios) == 3 and all(float(r) > 0 for r in ratios), line
            assert line.count("moves") == 3 and line.count("median") == 3, line
    # N = 800 is past the dense path and the search of all pairs: the neighbour list is used
    # and its skin printed
    assert re.search(r"N=800\s+PFML\s+60 steps; last skin", out), out


def run_script(name, args):
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *args.split()],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout


def test_loss_benchmark_prints_ratios_under_autocast():
    out = run_script("bench_losses.py", "--quick --no-memory --losses MFCont --autocast bfloat16")
    assert out.startswith("device=cpu (CPU) autocast=bfloat16"), out
    (row,) = [line for line in out.splitlines() if line.split()[2:3] == ["MFCont"]]
    assert float(row.split()[4]) > 0, row


@pytest.mark.parametrize("flag", ["--ops", "--ops-as-gpu"])
def test_losses_benchmark_counts_operations_and_host_waits(flag):
    out = run_script("bench_losses.py", f"--quick --no-memory --losses PFML {flag}")
    rows = {line.split()[2]: line.split() for line in out.splitlines() if line.split()[:2] == ["64", "100"]}
    ops, ratio, waits = (float(value) for value in rows["PFML"][-3:])
    assert rows["ProxyAnchor"][-2] == "1.00" and ops > float(rows["ProxyAnchor"][-3]) and ratio > 1, out
    assert waits >= 1, out


def import_benchmark(name):
    """The module ``name`` of benchmarks/ (its scripts import their neighbours by name)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_op_counter_counts_the_operations_that_make_the_host_wait():
    OpCounter = import_benchmark("ops").OpCounter
    x = torch.arange(6.0)
    with OpCounter() as counter:
        y = x * 2 + 1  # two operations, no wait
    assert (counter.ops, counter.waits) == (2, 0)
    with OpCounter() as counter:
        (y > 3).nonzero()  # gt, nonzero
        y[y > 3]  # gt, index with a mask
        y[torch.tensor([0, 2])]  # index with integers: no wait
        y.sum().item()  # sum, _local_scalar_dense
        y.repeat_interleave(torch.tensor([1, 0, 2, 1, 1, 1]))
    assert counter.waits == 4 and counter.ops >= 8


def test_precision_benchmark_deviations_are_ordered():
    out = run_script("bench_precision.py", "--steps 3")
    assert out.startswith("device=cpu (CPU)") and "3 random batches per loss" in out, out
    rows = [line.split() for line in out.splitlines() if re.search(r"\d\.\d\de-?\+?\d\d", line)]
    assert rows, out
    for row in rows:
        median, p95, largest = (float(v) for v in row[-7:-4])
        assert median <= p95 <= largest, row  # quantiles within the sample, never extrapolated


def test_gpu_settings_on_a_cpu_give_the_same_loss_and_are_put_back():
    """ops.as_on_gpu: a loss takes its GPU settings within it (the same values, other
    operations) and its own after it."""
    ops = import_benchmark("ops")
    from pml_fieldlosses import losses
    from pml_fieldlosses.losses.potential import distances

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, generator=g)
    labels = torch.arange(16).repeat_interleave(4)
    for loss_fn in [losses.PotentialFieldLoss(30, 16, dense=False), losses.MeanFieldContrastiveLoss(30, 16)]:
        before = dict(vars(loss_fn))
        with ops.OpCounter() as own:
            expected = loss_fn(x, labels)
        with ops.as_on_gpu(loss_fn), ops.OpCounter() as gpu:
            assert not distances.screens_tiles(x.device)
            torch.testing.assert_close(loss_fn(x, labels), expected, rtol=1e-6, atol=0)
        assert own.ops != gpu.ops  # another path was taken
        assert distances.screens_tiles(x.device)
        assert vars(loss_fn).keys() == before.keys() and loss_fn(x, labels).item() == expected.item()


def test_potential_step_profile_counts_operations_and_names_where_the_host_waits():
    out = run_script("profile_potential_step.py", "--num-classes 40 --after 3 --steps 2 --sites 3")
    rows = {line[:22].strip(): line[22:].split() for line in out.splitlines()[2:6]}
    assert set(rows) == {"loss fwd+bwd ms", "operations / step", "host waits / step", "page faults / step"}, (
        out
    )
    ops, reference_ops, ratio = (float(value) for value in rows["operations / step"])
    assert ops > reference_ops > 0 and ratio > 1, out
    faults, reference_faults = (float(value) for value in rows["page faults / step"][:2])
    assert faults >= 0 and reference_faults >= 0, out
    sites = out.split("per step, by place:\n")[1].splitlines()
    assert 1 <= len(sites) <= 3 and all(re.match(r"\s+[0-9.]+  \S", site) for site in sites), out
    assert any("pml_fieldlosses" not in site and ".py:" in site for site in sites), out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_gpu_checks_refuse_a_machine_without_cuda(tmp_path):
    script = BENCHMARKS.parent / "scripts" / "gpu_checks.sh"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        ["bash", str(script), str(tmp_path / "out")], capture_output=True, text=True, env=env
    )
    assert result.returncode == 2 and "torch sees no CUDA device" in result.stderr, result.stderr
    assert not list((tmp_path / "out").iterdir())  # nothing run, nothing written


def test_relational_head_benchmark_prints_a_ratio_per_step():
    args = "--batch-size 16 --in-features 32 --embedding-size 16 --num-branches 4 --num-classes 5 --reps 2 --clock cpu"
    out = run_script("bench_relational_head.py", args)
    assert "autocast=none" in out.splitlines()[0], out
    for step in ("linear", "relational", "relational head + base loss only"):
        (line,) = [
            line for line in out.splitlines() if re.match(rf"{re.escape(step)}\s+[0-9.]+\s+[0-9.]+$", line)
        ]
        assert float(line.split()[-1]) > 0, line


def assert_refuses_a_folder_without_the_package(script):
    """``script --other`` with a folder that holds no pml_fieldlosses package: a usage error
    naming --other, no traceback."""
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--other", str(BENCHMARKS.parent / "docs")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2 and "argument --other" in result.stderr and "Traceback" not in result.stderr


def test_relational_head_benchmark_compares_another_version_in_one_process():
    """--other: this checkout as the other version: its relational step is timed too, with a
    ratio and the same loss and gradients bit for bit; a folder without the package is refused
    naming --other."""
    root = BENCHMARKS.parent
    args = f"--batch-size 16 --in-features 32 --embedding-size 16 --num-branches 4 --num-classes 5 --reps 2 --other {root}"
    out = run_script("bench_relational_head.py", args)
    assert re.search(r"^relational \(--other\)\s+[0-9.]+\s+[0-9.]+$", out, re.M), out
    (line,) = [line for line in out.splitlines() if line.startswith("relational / relational (--other):")]
    assert float(re.search(r": ([0-9.]+);", line).group(1)) > 0 and line.endswith(
        "same loss and gradients: yes"
    )
    assert_refuses_a_folder_without_the_package("bench_relational_head.py")


def test_slow_paths_benchmark_prints_a_ratio_per_case_and_dtype():
    out = run_script("bench_slow_paths.py", "--shape 20 30 --reps 3")
    assert out.startswith("device=cpu (CPU)"), out
    for dtype in ("float32", "float64"):
        section = out.split(dtype, 1)[1].splitlines()[1:9]
        cases = [line.rsplit(None, 2) for line in section]
        assert [case[0] for case in cases][:2] == ["exp, ordinary values", "exp, -inf"], section
        assert all(float(us) > 0 and float(ratio) > 0 for _, us, ratio in cases), section


def test_benchmarks_refuse_a_device_torch_cannot_use():
    names = (
        "bench_losses.py",
        "bench_precision.py",
        "bench_relational_head.py",
        "bench_potential_training.py",
        "profile_potential_step.py",
        "bench_slow_paths.py",
    )
    for name, result in zip(names, refusals([(name, ["--device", "nonsense"]) for name in names])):
        assert result.returncode == 2 and "--device" in result.stderr.splitlines()[-1], (name, result.stderr)


def test_epoch_overhead_benchmark_prints_old_and_new_per_part():
    args = "--reps 1 --samples 600 --features 64 --classes 50 --autocast bfloat16"
    out = run_script("bench_epoch_overhead.py", args)
    assert out.startswith("device=cpu (CPU) autocast=bfloat16"), out
    for part in ("read batches", "records", "clip", "epoch (read + records + clip + steps)"):
        (line,) = [line for line in out.splitlines() if line.startswith(part)]
        assert re.search(r"old\s+[0-9.]+ ms\s+new\s+[0-9.]+ ms\s+x[0-9.]+", line), line


TINY_TRAJECTORY = (
    "--num-classes 300 --steps 30 --batch-size 32 --embedding-size 16 --input-size 16 --window 3 --threads 1"
)


def refusal(script, args):
    (result,) = refusals([(script, args)])
    return result


def refusals(cases):
    """refusal(script, args) of each (script, args) of ``cases``, the processes side by side
    (most of a refusal's time is importing torch): their results in the same order."""
    processes = [
        subprocess.Popen(
            [sys.executable, str(BENCHMARKS / script), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for script, args in cases
    ]
    try:
        results = []
        for process in processes:
            stdout, stderr = process.communicate(timeout=300)
            results.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
        return results
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.mark.parametrize("choice, uses_bfloat16", [("yes", True), ("no", False)])
def test_potential_training_searches_in_the_precision_asked_for(choice, uses_bfloat16, monkeypatch):
    bench = import_benchmark("bench_potential_training")
    points = torch.randn(8, 16)
    for name in bench.LOSSES:
        loss_fn = bench.make_loss(name, 4, 16, 0.4, bfloat16_search=bench.BFLOAT16_SEARCH[choice])
        assert loss_fn.use_bfloat16_search(points) is uses_bfloat16, (name, choice)
        # a float64 search never multiplies in bfloat16
        assert not loss_fn.use_bfloat16_search(points.double())
    # the trajectories' losses are made so
    made, make_loss = [], bench.make_loss
    monkeypatch.setattr(bench, "make_loss", lambda *a, **k: made.append(k) or make_loss(*a, **k))
    args = bench.make_parser().parse_args(
        [*TINY_TRAJECTORY.split(), "--steps", "6", "--bfloat16-search", choice]
    )
    bench.run_scale(args, 30, torch.Generator().manual_seed(0))
    assert [k.get("bfloat16_search") for k in made] == [uses_bfloat16] * len(bench.LOSSES)
    # auto: the losses' own default (bfloat16 products where they pay on this CPU)
    assert bench.make_loss("PFML", 4, 16, 0.4).bfloat16_search is None
    out = run_script("bench_potential_training.py", f"{TINY_TRAJECTORY} --bfloat16-search {choice}")
    searches = "bfloat16" if uses_bfloat16 else "float32"
    assert out.splitlines()[0].endswith(f"; searches: {searches}"), out
    assert re.search(r"N=300\s+PFML\s+start.*\| end", out), out


def test_potential_training_prints_each_windows_step_times():
    """--step-times: every timed step of each window, the loss's time and ProxyAnchor's, whose
    mean is the window's cell."""
    out = run_script("bench_potential_training.py", f"{TINY_TRAJECTORY} --steps 12 --window 3 --step-times")
    for name in ("PFML", "CPML"):
        for stage in ("start", "middle", "end"):
            (line,) = re.findall(rf"N=300\s+{name}\s+{stage} step:ms/ProxyAnchor ms (.*)", out)
            steps = [re.fullmatch(r"(\d+):([0-9.]+)/([0-9.]+)", cell) for cell in line.split()]
            assert len(steps) == 3 and all(steps), line
            numbers = [int(m.group(1)) for m in steps]
            assert numbers == list(range(numbers[0], numbers[0] + 3)), line
        assert numbers[0] == 12 - 3  # the end window
    assert re.search(r"N=300\s+PFML\s+start step:ms/ProxyAnchor ms 1:", out), out


def test_potential_training_refuses_windows_it_cannot_time():
    """Too few steps for three windows after the first step, or an empty window: a usage
    error naming both options, no traceback; the fewest steps that make three windows run."""
    bad_options = (["--steps", "3"], ["--window", "0"])
    cases = [("bench_potential_training.py", [*TINY_TRAJECTORY.split(), *bad]) for bad in bad_options]
    for result in refusals(cases):
        assert result.returncode == 2, result.stderr
        assert "--window needs at least 1 step and --steps at least 4" in result.stderr.splitlines()[-1]
    out = run_script("bench_potential_training.py", f"{TINY_TRAJECTORY} --steps 4")
    assert re.search(r"N=300\s+PFML\s+start.*\| middle.*\| end", out), out


def test_potential_training_state_resumes_and_feeds_the_list_limit_and_versions_benchmarks(tmp_path):
    state = tmp_path / "state.pt"
    out = run_script("bench_potential_training.py", f"{TINY_TRAJECTORY} --save-state {state} --stop-at 20")
    assert "stopped after step 20" in out and state.exists(), out
    out = run_script("bench_potential_training.py", f"{TINY_TRAJECTORY} --load-state {state}")
    assert "resumed from" in out and re.search(r"N=300\s+CPML\s+start.*\| end", out), out
    # a state of another configuration is refused, naming the setting that differs
    other = [*TINY_TRAJECTORY.split(), "--delta", "0.3", "--load-state", str(state)]
    result = refusal("bench_potential_training.py", other)
    assert result.returncode == 2 and "--delta 0.4 (this run: 0.3)" in result.stderr, result.stderr

    # bench_versions.py goes on from the state, with its settings (not the options' defaults)
    root = BENCHMARKS.parent
    out = run_script(
        "bench_versions.py",
        f"--other {root} --load-state {state} --states 0 2 --window 2 --passes 2 --threads 1",
    )
    assert f"from {state}: step 20 of its trajectory" in out, out
    lines = [line for line in out.splitlines() if line.startswith("N=300")]
    assert len(lines) == 4 and all(line.endswith("same losses: yes") for line in lines), out
    result = refusal("bench_versions.py", ["--other", str(root), "--load-state", str(tmp_path / "none.pt")])
    assert result.returncode == 2 and "--load-state" in result.stderr.splitlines()[-1], result.stderr

    args = (
        f"{state} --loss PFML --limits 1 4 --products float32 bfloat16 --steps 6 --skip 2 --threads 1"
        " --projection-ranks 2 16 --shell"
    )
    out = run_script("bench_list_limit.py", args)
    for factor in ("x1", "x4"):
        rows = [line.split() for line in out.splitlines() if line.startswith(factor + " ")]
        assert [row[1] for row in rows] == ["float32", "bfloat16"], out
        assert all(float(row[3]) > 0 and float(row[4]) > 0 for row in rows), rows  # ms, ratio to PA
    assert "the same proxies after 6 steps for every limit and products: yes" in out, out
    (header,) = [line for line in out.splitlines() if line.startswith("projection bound")]
    counts = re.search(r"(\d+) pairs of different classes, (\d+) within", header).groups()
    pairs, within = (int(count) for count in counts)
    rows = [line.split() for line in out.splitlines() if re.match(r"\d+\s+[0-9.]+\s+[0-9.]+%$", line)]
    shares = {int(row[0]): float(row[-1].rstrip("%")) for row in rows}
    assert sorted(shares) == [2, 16] and 0 <= shares[2] <= 100, out
    # at full rank (D = 16) the bound is the distance itself: it leaves the pairs within the cutoff
    assert shares[16] == round(100 * within / pairs, 1), out
    # --shell counts the same pairs, its quantiles rise, its shares within wider margins too
    (shell,) = [line for line in out.splitlines() if line.startswith("pair distances")]
    assert f"{pairs} pairs of different classes, {within} within the cutoff 0.4" in shell, shell
    (line,) = [line for line in out.splitlines() if line.startswith("their quantiles")]
    quantiles = [float(value) for value in re.findall(r"% ([0-9.]+)", line)]
    assert len(quantiles) == 5 and quantiles == sorted(quantiles) and 0 < quantiles[-1] <= 2, line
    (line,) = [line for line in out.splitlines() if line.startswith("within the cutoff + ")]
    near = [float(value) for value in re.findall(r"([0-9.]+)%", line)]
    assert len(near) == 4 and near == sorted(near) and near[0] >= 100 * within / pairs - 0.01, line
    (line,) = [line for line in out.splitlines() if line.startswith("multiply-adds per step")]
    needed = 32 * 600 * 16 + 3 * 16 * within  # B·P·D embedding-proxy distances + the pairs within the cutoff
    assert f"= {needed / 1e6:.0f} M, {needed / (3 * 32 * 300 * 16):.2f}x ProxyAnchor" in line, line


def test_list_limit_benchmark_refuses_what_it_cannot_read(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a state")
    older = tmp_path / "older.pt"
    torch.save({"format": "bench_potential_training state 1"}, older)
    cases = [
        ([str(bad)], "not a saved trajectory state"),
        ([str(older)], "saved by another version of this script ('bench_potential_training state 1'"),
        ([str(bad), "--device", "nonsense"], "--device"),
        ([str(tmp_path / "missing.pt")], "cannot read it"),
    ]
    results = refusals([("bench_list_limit.py", args) for args, _ in cases])
    for (args, expected), result in zip(cases, results):
        last = result.stderr.splitlines()[-1]
        assert result.returncode == 2 and expected in last, (args, result.stderr)
        assert expected == "--device" or f"state {args[0]}:" in last, last  # names its own argument


def test_versions_compares_this_checkout_with_another_in_one_process():
    """bench_versions.py against this same checkout (as the other version): a line per state
    and loss with both times, their ratios, and the same losses at every step; a folder
    without the package is refused naming --other."""
    root = BENCHMARKS.parent
    args = f"--other {root} --num-classes 30 --states 0 4 --window 3 --passes 2 --batch-size 32"
    args += " --embedding-size 16 --input-size 16 --threads 1"
    out = run_script("bench_versions.py", args)
    lines = [line for line in out.splitlines() if line.startswith("N=30")]
    assert len(lines) == 4, out  # 2 states x 2 losses
    for line in lines:
        ratios = re.findall(r"x([0-9.]+)", line)
        assert len(ratios) == 2 and all(float(r) > 0 for r in ratios), line
        assert float(re.search(r"this/other ([0-9.]+)", line).group(1)) > 0
        assert line.endswith("same losses: yes"), line
    assert_refuses_a_folder_without_the_package("bench_versions.py")
