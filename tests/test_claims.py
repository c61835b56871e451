"""``pml-fieldlosses claims``: the verdict rule, the claims table, the loss names
it needs, the proxy-to-data distance, and a tiny end-to-end run that resumes."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats

from pml_fieldlosses.app import catalog, cli
from pml_fieldlosses.app.bench import runs
from pml_fieldlosses.app.bench.result import RunResult
from pml_fieldlosses.app.bench.run import proxy_distance
from pml_fieldlosses.app.claims import report, table, verdict
from pml_fieldlosses.app.claims.measures import evaluate
from pml_fieldlosses.app.claims.report import missing_warning
from pml_fieldlosses.app.claims.run import level_configs, report_folder
from pml_fieldlosses.app.claims.verdict import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Interval

from .test_bench import make_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("data") / "shapes")


# --- the verdict rule ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 5, 10])
def test_interval_is_scipys_paired_t_interval(n):
    rng = np.random.default_rng(n)
    a, b = rng.normal(0.3, 0.02, n), rng.normal(0.29, 0.02, n)
    interval = verdict.paired_interval(a, b)
    expected = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert interval.n == n and interval.mean == pytest.approx(np.mean(a - b), abs=1e-15)
    assert (interval.low, interval.high) == pytest.approx((expected.low, expected.high), abs=1e-12)


def test_direction_decides_reproduced_or_not():
    above, below, across = (
        Interval(0.02, 0.01, 0.03, 3),
        Interval(-0.02, -0.03, -0.01, 3),
        Interval(0, -0.01, 0.01, 3),
    )
    assert verdict.verdict(above, "greater") == REPRODUCED
    assert verdict.verdict(below, "greater") == NOT_REPRODUCED
    assert verdict.verdict(across, "greater") == INCONCLUSIVE
    assert verdict.verdict(above, "less") == NOT_REPRODUCED
    assert verdict.verdict(below, "less") == REPRODUCED
    assert verdict.verdict(across, "less") == INCONCLUSIVE
    with pytest.raises(ValueError, match="direction"):
        verdict.verdict(above, "bigger")


def test_an_interval_touching_zero_is_inconclusive():
    assert verdict.verdict(Interval(0.01, 0.0, 0.02, 3), "greater") == INCONCLUSIVE
    assert verdict.verdict(Interval(-0.01, -0.02, 0.0, 3), "less") == INCONCLUSIVE


def test_ties_and_constant_differences():
    tie = verdict.paired_interval([0.2, 0.3, 0.25], [0.2, 0.3, 0.25])
    assert (tie.mean, tie.low, tie.high) == (0, 0, 0)
    assert verdict.verdict(tie, "greater") == verdict.verdict(tie, "less") == INCONCLUSIVE
    assert verdict.verdict(tie, "none") == REPRODUCED
    # the same gain on every seed: the interval is that gain
    constant = verdict.paired_interval([3.0, 5.0, 4.0], [1.0, 3.0, 2.0])
    assert constant.low == constant.high == 2 and verdict.verdict(constant, "greater") == REPRODUCED


def test_two_seeds_give_a_wide_interval_and_one_seed_none():
    gains = [0.010, 0.020]
    two = verdict.paired_interval(gains, [0, 0])
    assert two.high - two.low == pytest.approx(2 * stats.t.ppf(0.975, 1) * np.std(gains, ddof=1) / np.sqrt(2))
    assert verdict.verdict(two, "greater") == INCONCLUSIVE  # t(0.975, 1) = 12.7
    three = verdict.paired_interval([0.010, 0.020, 0.015], [0, 0, 0])
    assert verdict.verdict(three, "greater") == REPRODUCED
    one = verdict.paired_interval([0.5], [0.1])
    assert one.mean == pytest.approx(0.4) and math.isnan(one.low) and math.isnan(one.high)
    assert verdict.verdict(one, "greater") == INCONCLUSIVE and verdict.verdict(one, "none") == INCONCLUSIVE
    with pytest.raises(ValueError, match="same length"):
        verdict.paired_interval([1, 2], [1, 2, 3])


def test_no_effect_claims_need_a_narrow_interval():
    eps = verdict.EQUIVALENCE
    assert verdict.verdict(Interval(0.001, -eps / 2, eps / 2, 3), "none") == REPRODUCED
    assert verdict.verdict(Interval(0.0, -3 * eps, 3 * eps, 3), "none") == INCONCLUSIVE
    assert (
        verdict.verdict(Interval(0.004, 0.002, 0.006, 3), "none") == NOT_REPRODUCED
    )  # small but significant


def test_a_claim_is_reproduced_only_when_every_comparison_is():
    assert verdict.combine([REPRODUCED, REPRODUCED]) == REPRODUCED
    assert verdict.combine([REPRODUCED, INCONCLUSIVE]) == INCONCLUSIVE
    assert verdict.combine([REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE]) == NOT_REPRODUCED
    with pytest.raises(ValueError, match="at least one"):
        verdict.combine([])


# --- the claims table ---------------------------------------------------------------------------


def test_every_claim_names_losses_the_catalog_builds():
    assert table.validate()
    needed = table.runs_needed(table.CLAIMS)
    assert set(needed) == {0.0, *table.NOISE_LEVELS}
    for level, names in needed.items():
        assert len(names) == len(set(names)), level
        for name in names:
            entry = catalog.get_entry(name)
            assert isinstance(entry.build(10, 16), torch.nn.Module), name
            assert isinstance(entry.make_embedder(32, 16), torch.nn.Module), name
    # runs are shared: the bench's PFML is one run for every PFML claim
    assert needed[0.0].count("PFML") == 1
    assert sum("PFML" in c.a + c.b for claim in table.CLAIMS for c in claim.comparisons) > 5
    for claim in table.CLAIMS:
        assert claim.id and claim.paper and claim.section and claim.claim and claim.experiment


@pytest.mark.parametrize(
    "comparison, message",
    [
        (table.Comparison(("PFML[gamma=1]",), ("PFML",), "greater"), "claim bad: loss PFML takes"),
        (table.Comparison(("NoSuchLoss",), ("PFML",), "greater"), "claim bad: unknown loss 'NoSuchLoss'"),
        (table.Comparison(("PFML",), ("CPML",), "greater", "speed"), "unknown measure 'speed'"),
        (table.Comparison(("PFML",), ("CPML",), "up"), "unknown direction 'up'"),
        (table.Comparison(("PFML",), ("CPML",), "less", "noise_drop"), "noise_drop needs"),
        (table.Comparison(("PFML",), ("PFML",), "less"), "disjoint"),
    ],
)
def test_a_bad_claim_is_refused_by_its_id(comparison, message):
    bad = table.Claim("bad", "paper", "§1", "claim", "experiment", (comparison,))
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        table.validate((bad,))


def test_claims_are_chosen_by_id():
    assert [c.id for c in table.get_claims(["pfml-beats-cpml", "pfml-alpha"])] == [
        "pfml-alpha",
        "pfml-beats-cpml",
    ]
    with pytest.raises(ValueError, match="unknown claim 'nope'"):
        table.get_claims(["nope"])
    dup = table.CLAIMS[0]
    with pytest.raises(ValueError, match="unique"):
        table.validate((dup, dup))


def test_level_configs_run_each_loss_once_per_noise_level(folder, tmp_path):
    from pml_fieldlosses.app.claims import claims_config

    config = claims_config(data=str(folder), out=str(tmp_path))
    configs = level_configs(config, table.get_claims(["pfml-noise", "pfml-beats-cpml"]))
    assert {level: c.losses for level, c in configs.items()} == {
        0.0: ("PFML", "ProxyAnchor", "MultiSimilarity", "Contrastive", "CPML"),
        0.1: ("PFML", "ProxyAnchor", "MultiSimilarity", "Contrastive"),
        0.2: ("PFML", "ProxyAnchor", "MultiSimilarity", "Contrastive"),
        0.4: ("PFML", "ProxyAnchor", "MultiSimilarity", "Contrastive"),
    }
    assert configs[0.2].label_noise == 0.2 and configs[0.0].epochs == 30
    assert len({c.folder_name() for c in configs.values()}) == 4


def test_evaluate_pairs_seeds_and_averages_arms():
    def result(name, seed, value, level=0.0, **kw):
        test = {"mean_average_precision_at_r": value, "precision_at_1": 0, "r_precision": 0}
        return (level, name, seed), RunResult(name, "x", seed, test, 1, 0.5, **kw)

    claim = table.Claim(
        "c",
        "p",
        "s",
        "claim",
        "exp",
        (
            table.Comparison(("A", "B"), ("C",), "greater"),
            table.Comparison(("A",), ("C",), "less", "noise_drop", 0.2),
        ),
    )
    values = {"A": [0.30, 0.32, 0.31], "B": [0.20, 0.22, 0.21], "C": [0.10, 0.12, 0.11]}
    noisy = {"A": [0.29, 0.31, 0.30], "C": [0.05, 0.07, 0.06]}
    found = dict(result(n, s, v) for n, vs in values.items() for s, v in enumerate(vs))
    found.update(result(n, s, v, 0.2) for n, vs in noisy.items() for s, v in enumerate(vs))
    (e,) = evaluate([claim], found, 3, max_epochs=30)
    first, second = e["parts"]
    assert first["a"] == pytest.approx([0.25, 0.27, 0.26]) and first["verdict"] == REPRODUCED
    assert second["a"] == pytest.approx([0.01] * 3) and second["b"] == pytest.approx([0.05] * 3)
    assert second["verdict"] == REPRODUCED and e["verdict"] == REPRODUCED
    assert first["censored"] == second["censored"] == 0  # only the best epoch can be censored


@pytest.mark.parametrize("b_epochs_run, expected", [(20, REPRODUCED), (30, INCONCLUSIVE)])
def test_epochs_to_best_is_censored_when_a_run_used_every_epoch(b_epochs_run, expected):
    """A run that used all its epochs (early stopping never fired) has a best epoch that is
    only a lower bound: comparing it is inconclusive, however narrow the interval."""
    comparison = table.Comparison(("A",), ("B",), "less", "epochs_to_best")
    claim = table.Claim("c", "p", "s", "claim", "exp", (comparison,))
    test = {"mean_average_precision_at_r": 0.2, "precision_at_1": 0, "r_precision": 0}
    found = {}
    for seed, (a_best, b_best) in enumerate([(5, 10), (6, 10), (5, 11)]):
        found[(0.0, "A", seed)] = RunResult("A", "x", seed, test, a_best, 0.5, epochs_run=a_best + 10)
        found[(0.0, "B", seed)] = RunResult("B", "x", seed, test, b_best, 0.5, epochs_run=b_best + 10)
    found[(0.0, "B", 1)] = RunResult("B", "x", 1, test, 10, 0.5, epochs_run=b_epochs_run)
    (e,) = evaluate([claim], found, 3, max_epochs=30)
    (part,) = e["parts"]
    assert part["interval"].high < 0  # A is faster on every seed
    assert part["verdict"] == e["verdict"] == expected
    assert part["censored"] == (1 if expected == INCONCLUSIVE else 0)
    row = report.comparison_rows([e])[0]
    assert ("censored: 1/6 runs at the epoch limit" in row[8]) == (expected == INCONCLUSIVE)


def test_a_missing_value_makes_the_comparison_inconclusive_and_is_named(tmp_path):
    """A run without a value of the measure (proxy_distance None: a result written before the
    field or a diverged model; no validation MAP@R at EARLY_EPOCH; a nan test MAP@R) makes
    the comparison inconclusive however clear the other seeds are, and the report names it."""
    test = {"mean_average_precision_at_r": 0.2, "precision_at_1": 0, "r_precision": 0}
    early = {"epoch": [1, 2, 3], "map_at_r": [0.1, 0.2, 0.3]}
    found = {}
    for seed in range(3):
        for name, distance in (("PFML", 0.1), ("CPML", 0.5)):
            found[(0.0, name, seed)] = RunResult(
                name, "x", seed, dict(test), 5, 0.5, val_history=early, proxy_distance=distance + seed / 100
            )
    near = table.Comparison(("PFML",), ("CPML",), "less", "proxy_distance")
    at_three = table.Comparison(("PFML",), ("CPML",), "greater", "val_map_early")
    claims = [
        table.Claim("near", "p", "s", "claim", "exp", (near,)),
        table.Claim("early", "p", "s", "claim", "exp", (at_three,)),
    ]
    ((complete,), (fine,)) = (e["parts"] for e in evaluate(claims, found, 3, max_epochs=30))
    assert complete["verdict"] == REPRODUCED and complete["missing"] == [] and fine["missing"] == []

    found[(0.0, "CPML", 1)].proxy_distance = None
    found[(0.0, "PFML", 0)].val_history = {"epoch": [1, 2], "map_at_r": [0.1, 0.2]}  # stopped before 3
    found[(0.0, "PFML", 2)].test["mean_average_precision_at_r"] = math.nan
    mapped = table.Comparison(("PFML",), ("CPML",), "greater")
    claims.append(table.Claim("map", "p", "s", "claim", "exp", (mapped,)))
    evaluated = evaluate(claims, found, 3, max_epochs=30)
    parts = [e["parts"][0] for e in evaluated]
    assert [p["missing"] for p in parts] == [[("CPML", 1)], [("PFML", 0)], [("PFML", 2)]]
    assert all(p["verdict"] == e["verdict"] == INCONCLUSIVE for p, e in zip(parts, evaluated))
    rows = report.comparison_rows(evaluated)
    assert [row[8] for row in rows] == [
        f"n/a: no value for {n}" for n in ("CPML seed 1", "PFML seed 0", "PFML seed 2")
    ]
    report.write_csv(evaluated, "d", tmp_path / "c.csv")
    assert "CPML seed 1" in (tmp_path / "c.csv").read_text()
    warning = missing_warning(evaluated)
    assert (
        "\n" not in warning
        and "near proxy_distance: CPML seed 1" in warning
        and "map map: PFML seed 2" in warning
    )
    many = [(n, s) for n in ("A", "B") for s in range(3)]
    assert report.missing_text(many) == "A seed 0, A seed 1, A seed 2 and 3 more"


def test_report_folder_depends_on_the_claims_and_the_seeds(tmp_path):
    from pml_fieldlosses.app.claims import claims_config

    config = claims_config(out=str(tmp_path))
    full = report_folder(config)
    assert report_folder(config, table.get_claims(None)) == full and full.name.endswith("-3seeds")
    one = report_folder(config, table.get_claims(["pfml-alpha"]))
    two = report_folder(config, table.get_claims(["pfml-beats-cpml", "pfml-alpha"]))
    assert len({full, one, two, report_folder(claims_config(out=str(tmp_path), seeds=2))}) == 4
    assert one.name.startswith(full.name + "-pfml-alpha-") and "-pfml-alpha+1-" in two.name
    assert two == report_folder(
        config, [table.get_claims(["pfml-beats-cpml"])[0], table.get_claims(["pfml-alpha"])[0]]
    )


def test_one_seed_says_no_interval_is_possible(tmp_path):
    from pml_fieldlosses.app.claims import claims_config

    test = {"mean_average_precision_at_r": 0.2, "precision_at_1": 0, "r_precision": 0}
    found = {(0.0, n, 0): RunResult(n, "x", 0, test, 5, 0.5) for n in ("A", "B")}
    claim = table.Claim("c", "p", "s", "claim", "exp", (table.Comparison(("A",), ("B",), "greater"),))
    evaluated = evaluate([claim], found, 1, max_epochs=30)
    assert report.comparison_rows(evaluated)[0][8] == "n/a (< 2 seeds)"
    info = {"data": "d", "folders": {0.0: "f"}, "runs": 2, "wall_seconds": 1.0, "invocations": 1}
    report.write_markdown(evaluated, claims_config(seeds=1), info, {}, tmp_path / "README.md")
    text = (tmp_path / "README.md").read_text()
    assert "With 1 seed no interval can be computed: every comparison is inconclusive." in text
    assert "nan" not in text


# --- loss names with settings, the proxy distance, old results ---------------------------------


def test_a_name_sets_any_constructor_keyword():
    entry = catalog.get_entry("PFML[alpha=2,proxies_per_class=4]")
    loss = entry.build(10, 16)
    assert (
        loss.alpha == 2 and loss.proxies.shape == (10, 4, 16) and loss.delta == catalog.LOSSES["PFML"].value
    )
    assert catalog.get_entry("PFML[delta=0.3,repulsion_delta=0.6]").build(10, 16).repulsion_delta == 0.6
    assert catalog.get_entry("MFCont[mf_reg_weight=1]").build(10, 16).mf_reg_weight == 1
    with pytest.raises(ValueError, match=r"takes \[delta=VALUE\].*one of delta, proxies_per_class, alpha"):
        catalog.get_entry("PFML[gamma=2]")
    with pytest.raises(ValueError, match="sets alpha twice"):
        catalog.get_entry("PFML[alpha=2,alpha=3]")
    with pytest.raises(ValueError, match="alpha='x' is not a number"):
        catalog.get_entry("PFML[alpha=x]")
    for text in (
        "nan",
        "inf",
        "-inf",
        "1_0",
        "0_5",
        "0x1",
        "1e",
        "",
        "1.5.2",
    ):  # what float() would take or not
        with pytest.raises(ValueError, match=rf"'PFML\[alpha={text}\]': alpha='{text}' is not a number"):
            catalog.get_entry(f"PFML[alpha={text}]")
    with pytest.raises(ValueError, match="alpha='1e999' is not a finite number"):
        catalog.get_entry("PFML[alpha=1e999]")
    assert [
        catalog.get_entry(f"PFML[alpha={t}]").options for t in ("2", "-2", "0.5", ".5", "5.", "1e-3", "2E+1")
    ] == [(("alpha", v),) for v in (2, -2, 0.5, 0.5, 5.0, 1e-3, 20.0)]
    with pytest.raises(ValueError, match="proxies_per_class"):  # the loss's own check, by name
        catalog.get_entry("PFML[proxies_per_class=1.5]").build(10, 16)
    # the claims' extra losses are named but not run by the bench by default
    assert set(catalog.EXTRA_LOSSES) == {"Triplet", "DRML-Triplet", "DRML-CosFace"}
    assert not set(catalog.EXTRA_LOSSES) & set(catalog.default_losses())
    assert catalog.get_entry("DRML-CosFace").value == catalog.LOSSES["CosFace"].value


def test_the_candidates_of_a_name_with_settings_are_names_get_entry_reads():
    """select's candidates of PFML[alpha=2]: one bracket with the settings and the tuned value."""
    entry = catalog.get_entry("PFML[alpha=2,proxies_per_class=4]")
    names = entry.candidates()
    assert names == [f"PFML[alpha=2,proxies_per_class=4,delta={v:g}]" for v in entry.grid]
    for name, value in zip(names, entry.grid):
        candidate = catalog.get_entry(name)
        assert candidate.value == value and dict(candidate.options) == {"alpha": 2, "proxies_per_class": 4}
        assert candidate.variant(value) == name
    assert catalog.LOSSES["CosFace"].candidates() == [
        "CosFace[margin=0.35]",
        "CosFace[margin=0.175]",
        "CosFace[margin=0.7]",
    ]
    # a value :g would round is written in full, so that it names the same run
    assert catalog.get_entry("PFML[alpha=0.1234567]").variant(0.3) == "PFML[alpha=0.1234567,delta=0.3]"
    assert catalog.get_entry("PFML").variant(1 / 3) == f"PFML[delta={1 / 3!r}]"


def test_proxy_distance_is_the_mean_distance_to_the_nearest_sample_of_the_class():
    torch.manual_seed(0)
    embeddings = torch.nn.functional.normalize(torch.randn(30, 8), dim=1)
    labels = torch.arange(30) % 3
    proxies = torch.randn(3, 2, 8)

    class Tester:
        def get_all_embeddings(self, dataset, trunk, embedder, collate_fn=None):
            assert len(dataset) == 30
            return embeddings, labels[:, None]

    split = SimpleNamespace(train=np.arange(30), train_labels=labels.numpy())
    inputs = SimpleNamespace(split=split, eval_inputs=np.zeros((30, 1)), eval_collate=None)
    loss = SimpleNamespace(proxies=torch.nn.Parameter(proxies))
    unit = torch.nn.functional.normalize(proxies, dim=-1)
    expected = np.mean(
        [
            min(float(torch.dist(unit[c, k], embeddings[i])) for i in range(30) if labels[i] == c)
            for c in range(3)
            for k in range(2)
        ]
    )
    assert proxy_distance(loss, Tester(), inputs, None, None) == pytest.approx(expected, rel=1e-6)
    # proxies on their class's samples: distance 0; a loss without proxies: None
    loss.proxies = torch.nn.Parameter(embeddings[:3].clone())  # samples 0, 1, 2 are of classes 0, 1, 2
    assert proxy_distance(loss, Tester(), inputs, None, None) == pytest.approx(0, abs=1e-3)  # cdist via mm
    assert proxy_distance(SimpleNamespace(), Tester(), inputs, None, None) is None


def test_a_result_written_before_proxy_distance_is_read(tmp_path):
    path = tmp_path / "result.json"
    data = RunResult("PFML", "ours", 0, None, 1, 0.5).as_dict()
    del data["proxy_distance"]
    path.write_text(json.dumps(data))
    assert RunResult.read(path).proxy_distance is None


# --- end to end ---------------------------------------------------------------------------------


def test_claims_end_to_end_report_and_resume(folder, tmp_path, capsys, monkeypatch):
    argv = ["claims", "--data", str(folder), "--image-size", "32", "--embedding-size", "16"]
    argv += ["--claims", "pfml-proxies-near-data,pfml-beats-cpml", "--epochs", "1", "--seeds", "2"]
    argv += ["--workers", "1", "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "pfml-proxies-near-data" in printed and "pfml-beats-cpml" in printed
    assert "95 % CI" in printed and "Rule:" in printed and "wall time:" in printed
    (report,) = (tmp_path / "out").glob("claims-*")
    summary = json.loads((report / "summary.json").read_text())
    assert [c["id"] for c in summary["claims"]] == ["pfml-proxies-near-data", "pfml-beats-cpml"]
    for claim in summary["claims"]:
        assert claim["verdict"] in (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)
        for c in claim["comparisons"]:
            assert c["n"] == 2 and c["low"] <= c["mean"] <= c["high"] and c["verdict"]
        assert (report / "plots" / f"{claim['id']}.png").stat().st_size > 0
    distances = summary["claims"][0]["comparisons"][0]
    assert distances["measure"] == "proxy_distance" and all(0 <= d <= 2 for d in distances["a_per_seed"])
    text = (report / "README.md").read_text()
    assert "## Verdicts" in text and "**Rule.**" in text and "plots/pfml-beats-cpml.png" in text
    assert "2 seeds the t-interval is wide" in text
    assert (report / "comparisons.csv").read_text().count("\n") == 4  # header + 3 comparisons

    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was recomputed")

    monkeypatch.setattr(runs, "train_one", no_training)
    assert cli.main(argv) == 0
    assert "resuming: 6 of 6 runs" in capsys.readouterr().err
    again = json.loads((report / "summary.json").read_text())
    assert again["claims"] == summary["claims"]
    assert len(json.loads((report / "wall_time.json").read_text())["invocations"]) == 2

    # one of the two claims: its own report, the same runs, the two-claim report untouched
    subset = argv[: argv.index("--claims") + 1] + ["pfml-beats-cpml"] + argv[argv.index("--claims") + 2 :]
    assert cli.main(subset) == 0
    assert "resuming: 4 of 4 runs" in capsys.readouterr().err
    (other,) = set((tmp_path / "out").glob("claims-*")) - {report}
    assert [c["id"] for c in json.loads((other / "summary.json").read_text())["claims"]] == [
        "pfml-beats-cpml"
    ]
    assert json.loads((report / "summary.json").read_text())["claims"] == summary["claims"]
    assert len(json.loads((report / "wall_time.json").read_text())["invocations"]) == 2


def test_cli_refuses_unknown_claims(tmp_path, capsys):
    assert cli.main(["claims", "--claims", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown claim 'nope'" in capsys.readouterr().err
    for empty in (",", "", " , "):
        assert cli.main(["claims", "--claims", empty, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert "names no claim" in err and err.count("\n") == 1
    with pytest.raises(ValueError, match="no claim ids"):
        table.get_claims([])
    assert not list(tmp_path.iterdir())  # nothing written


def test_cli_refuses_too_few_epochs_for_the_early_validation_map(tmp_path, capsys):
    argv = ["claims", "--epochs", "2", "--out", str(tmp_path)]
    assert cli.main(argv + ["--claims", "pfml-alpha,mf-converge-faster"]) == 2
    err = capsys.readouterr().err
    assert "--epochs 2 is below 3: claim mf-converge-faster" in err and err.count("\n") == 1
    assert cli.main(argv) == 2  # all claims: mf-converge-faster among them
    assert not list(tmp_path.iterdir())


def test_a_claim_figure_that_cannot_be_drawn_is_skipped_and_the_report_written(tmp_path, capsys, monkeypatch):
    """The tables and summary come first; a figure that fails is named with why, in a warning
    and in README.md, and the other figures are drawn."""
    from pml_fieldlosses.app.claims import claims_config, plots

    test = {"mean_average_precision_at_r": 0.2, "precision_at_1": 0, "r_precision": 0}
    found = {(0.0, n, s): RunResult(n, "ours", s, dict(test), 5, 0.5) for n in ("A", "B") for s in range(3)}
    claims = [
        table.Claim(i, "p", "s", "claim", "exp", (table.Comparison(("A",), ("B",), "greater"),))
        for i in ("c1", "c2")
    ]
    evaluated = evaluate(claims, found, 3, max_epochs=30)
    real = plots.claim_figure

    def fails_for_c1(e, runs, seeds, path):
        if e["claim"].id == "c1":
            raise ValueError("cannot draw\nthis one")
        real(e, runs, seeds, path)

    monkeypatch.setattr(plots, "claim_figure", fails_for_c1)
    info = {"data": "d", "folders": {0.0: "f"}, "runs": 6, "wall_seconds": 1.0, "invocations": 1}
    made = report.write(evaluated, found, claims_config(seeds=3), info, tmp_path)
    assert made == {"c2": "plots/c2.png"} and (tmp_path / "plots" / "c2.png").stat().st_size > 0
    assert (
        "warning: figure plots/c1.png skipped: ValueError: cannot draw this one\n" in capsys.readouterr().err
    )
    text = (tmp_path / "README.md").read_text()
    assert "Figures not drawn: `plots/c1.png` (ValueError: cannot draw this one)." in text
    assert "![c2](plots/c2.png)" in text and "![c1]" not in text
    assert json.loads((tmp_path / "summary.json").read_text())["claims"][0]["id"] == "c1"
    assert (tmp_path / "comparisons.csv").read_text().count("\n") == 3
