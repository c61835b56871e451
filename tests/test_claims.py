"""``pml-fieldlosses claims``: the verdict rule, the claims table, the loss names
it needs, the proxy-to-data distance, and a tiny end-to-end run that resumes."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats

from pml_fieldlosses import catalog, cli
from pml_fieldlosses.bench import runs
from pml_fieldlosses.bench.result import RunResult
from pml_fieldlosses.bench.run import proxy_distance
from pml_fieldlosses.claims import report, table, verdict
from pml_fieldlosses.claims.run import evaluate, level_configs
from pml_fieldlosses.claims.verdict import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Interval

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
    above, below, across = Interval(0.02, 0.01, 0.03, 3), Interval(-0.02, -0.03, -0.01, 3), Interval(0, -0.01, 0.01, 3)
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
    assert verdict.verdict(Interval(0.004, 0.002, 0.006, 3), "none") == NOT_REPRODUCED  # small but significant


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
    assert [c.id for c in table.get_claims(["pfml-beats-cpml", "pfml-alpha"])] == ["pfml-alpha", "pfml-beats-cpml"]
    with pytest.raises(ValueError, match="unknown claim 'nope'"):
        table.get_claims(["nope"])
    dup = table.CLAIMS[0]
    with pytest.raises(ValueError, match="unique"):
        table.validate((dup, dup))


def test_level_configs_run_each_loss_once_per_noise_level(folder, tmp_path):
    from pml_fieldlosses.claims import claims_config

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
        "c", "p", "s", "claim", "exp",
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


# --- loss names with settings, the proxy distance, old results ---------------------------------


def test_a_name_sets_any_constructor_keyword():
    entry = catalog.get_entry("PFML[alpha=2,proxies_per_class=4]")
    loss = entry.build(10, 16)
    assert loss.alpha == 2 and loss.proxies.shape == (10, 4, 16) and loss.delta == catalog.LOSSES["PFML"].value
    assert catalog.get_entry("PFML[delta=0.3,repulsion_delta=0.6]").build(10, 16).repulsion_delta == 0.6
    assert catalog.get_entry("MFCont[mf_reg_weight=1]").build(10, 16).mf_reg_weight == 1
    with pytest.raises(ValueError, match=r"takes \[delta=VALUE\].*one of delta, proxies_per_class, alpha"):
        catalog.get_entry("PFML[gamma=2]")
    with pytest.raises(ValueError, match="sets alpha twice"):
        catalog.get_entry("PFML[alpha=2,alpha=3]")
    with pytest.raises(ValueError, match="alpha='x' is not a number"):
        catalog.get_entry("PFML[alpha=x]")
    with pytest.raises(ValueError, match="proxies_per_class"):  # the loss's own check, by name
        catalog.get_entry("PFML[proxies_per_class=1.5]").build(10, 16)
    # the claims' extra losses are named but not run by the bench by default
    assert set(catalog.EXTRA_LOSSES) == {"Triplet", "DRML-Triplet", "DRML-CosFace"}
    assert not set(catalog.EXTRA_LOSSES) & set(catalog.default_losses())
    assert catalog.get_entry("DRML-CosFace").value == catalog.LOSSES["CosFace"].value


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


def test_cli_refuses_unknown_claims(tmp_path, capsys):
    assert cli.main(["claims", "--claims", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown claim 'nope'" in capsys.readouterr().err
