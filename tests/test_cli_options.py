"""Every option of ``pml-fieldlosses bench``, ``select`` and ``claims`` is checked before
anything runs: a bad value is one line on stderr naming the option and what it takes, exit 2;
a folder that cannot be written is one line naming it, exit 1; nothing is trained or
written. No test here trains: the commands' run functions are replaced by ones that fail
the test if they are reached with a bad option (or record the options when they are good)."""

import errno
import os
import string
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pml_fieldlosses.app.bench")
from pml_fieldlosses.app import catalog, cli, extras
from pml_fieldlosses.app.claims import table
from pml_fieldlosses.app.claims.run import claims_config, report_folder

COMMANDS = ("bench", "select", "claims")
FEW = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# the number options: (option, lowest, highest, commands that have it)
INTEGERS = [
    ("--seeds", 1, cli.MAX_SEEDS, ("bench", "claims")),
    ("--epochs", 1, cli.MAX_EPOCHS, COMMANDS),
    ("--embedding-size", 2, cli.MAX_EMBEDDING_SIZE, COMMANDS),
    ("--image-size", 16, cli.MAX_IMAGE_SIZE, COMMANDS),
    ("--workers", 1, cli.MAX_WORKERS, COMMANDS),
]
KNOWN_LOSSES = {**catalog.LOSSES, **catalog.EXTRA_LOSSES}


@pytest.fixture
def runs(monkeypatch):
    """The plans that reached a command's run (none may, when an option is bad)."""
    reached = []
    for name in ("run_bench_command", "run_select_command", "run_claims_command"):
        monkeypatch.setattr(cli, name, reached.append)
    return reached


@pytest.fixture
def folders(tmp_path):
    """--out and --cache in a fresh folder; neither exists yet."""
    return tmp_path / "out", tmp_path / "cache"


def run(argv, capsys):
    """(exit code, stderr) of the command; argparse's own refusals exit, the checks return."""
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def assert_refused(argv, option, capsys, runs, code=2, words=()):
    """The command refuses ``argv`` with one line naming ``option`` (and ``words``), exit
    ``code``, no traceback, no run."""
    got, err = run(argv, capsys)
    assert got == code, (argv, err)
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert option in err and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)
    assert not runs
    return err


def with_folders(command, options, folders):
    out, cache = folders
    return [command, *options, "--out", str(out), "--cache", str(cache)]


def assert_nothing_written(folders):
    out, cache = folders
    assert not out.exists() and not cache.exists()


# --- numbers ------------------------------------------------------------------------------------


def integer_case():
    return st.sampled_from(INTEGERS).flatmap(lambda case: st.tuples(st.just(case), st.sampled_from(case[3])))


@FEW
@given(integer_case(), st.data())
def test_an_integer_out_of_range_is_refused(capsys, runs, folders, case, data):
    (option, low, high, _), command = case
    value = data.draw(st.one_of(st.integers(max_value=low - 1), st.integers(min_value=high + 1)))
    argv = with_folders(command, [f"{option}={value}"], folders)
    assert_refused(argv, option, capsys, runs, words=(f"from {low} to {high}",))
    assert_nothing_written(folders)


def not_an_integer(text):
    try:
        int(text)
    except ValueError:
        return True
    return False


@FEW
@given(integer_case(), st.text(max_size=10).filter(not_an_integer))
def test_an_integer_option_refuses_what_is_not_an_integer(capsys, runs, folders, case, text):
    (option, _, _, _), command = case
    assert_refused(with_folders(command, [f"{option}={text}"], folders), option, capsys, runs)
    assert_nothing_written(folders)


@FEW
@given(integer_case(), st.data())
def test_an_integer_in_range_reaches_the_run(capsys, runs, folders, case, data):
    (option, low, high, _), command = case
    if option == "--embedding-size":  # the DRML head splits the embedding in 4
        value = 4 * data.draw(st.integers(1, high // 4))
    elif option == "--epochs" and command == "claims":  # a claim reads epoch 3
        value = data.draw(st.integers(table.EARLY_EPOCH, high))
    else:
        value = data.draw(st.integers(low, high))
    runs.clear()
    code, err = run(with_folders(command, [f"{option}={value}"], folders), capsys)
    assert code == 0 and not err, err
    (plan,) = runs
    config = plan[0] if command == "claims" else plan
    assert getattr(config, option[2:].replace("-", "_")) == value


@FEW
@given(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not 0 <= x < 1).map(repr),
        st.text(max_size=8).filter(lambda t: not_a_fraction(t)),
    )
)
def test_label_noise_outside_zero_to_one_or_not_a_number_is_refused(capsys, runs, folders, text):
    argv = with_folders("bench", [f"--label-noise={text}"], folders)
    assert_refused(argv, "--label-noise", capsys, runs, words=("[0, 1)",))
    assert_nothing_written(folders)


def not_a_fraction(text):
    try:
        return not 0 <= float(text) < 1
    except ValueError:
        return True


@FEW
@given(st.floats(0, 1, exclude_max=True))
def test_label_noise_in_zero_to_one_reaches_the_run(capsys, runs, folders, fraction):
    runs.clear()
    code, err = run(with_folders("bench", [f"--label-noise={fraction!r}"], folders), capsys)
    assert code == 0 and not err, err
    assert runs[0].label_noise == fraction


# --- losses -------------------------------------------------------------------------------------


@FEW
@given(st.sampled_from(("bench", "select")), st.text(alphabet=", \t", max_size=6))
def test_an_empty_loss_list_is_refused(capsys, runs, folders, command, text):
    err = assert_refused(with_folders(command, [f"--losses={text}"], folders), "--losses", capsys, runs)
    assert "names no loss" in err
    assert_nothing_written(folders)


@FEW
@given(
    st.sampled_from(("bench", "select")),
    st.text(alphabet=string.ascii_letters + string.digits + "-_", min_size=1, max_size=12).filter(
        lambda name: name not in KNOWN_LOSSES
    ),
)
def test_an_unknown_loss_is_refused(capsys, runs, folders, command, name):
    err = assert_refused(with_folders(command, [f"--losses=PFML,{name}"], folders), "--losses", capsys, runs)
    assert f"unknown loss {name!r}" in err and "PFML" in err  # the names it knows
    assert_nothing_written(folders)


def well_bracketed(text):
    """Brackets that open and close in turn, never nested."""
    depth = 0
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            return False
    return depth == 0


@FEW
@given(
    st.sampled_from(["bench", "select"]),
    st.sampled_from(sorted(catalog.LOSSES)),
    st.text(alphabet="[]a=1,", min_size=1, max_size=8).filter(lambda t: not well_bracketed(t)),
)
def test_unbalanced_brackets_are_refused(capsys, runs, folders, command, name, tail):
    argv = with_folders(command, [f"--losses={name}{tail}"], folders)
    assert_refused(argv, "--losses", capsys, runs, words=("unbalanced brackets",))
    assert_nothing_written(folders)


@FEW
@given(
    st.sampled_from(["PFML", "CWMS", "ProxyAnchor", "DRML-ProxyAnchor"]),
    st.one_of(
        st.text(alphabet=string.ascii_lowercase + "_", min_size=1, max_size=10).map(lambda k: f"{k}=1"),
        st.sampled_from(["=1", "nosuchkey=1", "x"]),
    ),
)
def test_a_keyword_the_loss_does_not_take_is_refused(capsys, runs, folders, name, setting):
    if setting.partition("=")[0] in KNOWN_LOSSES[name].keywords():
        setting = "nosuchkey=1"
    argv = with_folders("bench", [f"--losses={name}[{setting}]"], folders)
    assert_refused(argv, "--losses", capsys, runs, words=(KNOWN_LOSSES[name].tuned,))
    assert_nothing_written(folders)


@FEW
@given(st.sampled_from(["abc", "", "nan", "inf", "1_0", "0x1", "1,", "2e", "--1"]))
def test_a_loss_value_that_is_not_a_number_is_refused(capsys, runs, folders, text):
    argv = with_folders("bench", [f"--losses=PFML[delta={text}]"], folders)
    assert_refused(argv, "--losses", capsys, runs)
    assert_nothing_written(folders)


@pytest.mark.parametrize(
    "losses", ["PFML[delta=-1]", "PFML[proxies_per_class=0]", "CWMS[alpha=-2]", "PFML[alpha=nan]"]
)
def test_a_value_the_losses_constructor_refuses_is_refused_before_the_data(capsys, runs, folders, losses):
    assert_refused(with_folders("bench", [f"--losses={losses}"], folders), "--losses", capsys, runs)
    assert_nothing_written(folders)


def test_an_embedding_size_the_drml_head_cannot_split_is_refused(capsys, runs, folders):
    err = assert_refused(
        with_folders("bench", ["--embedding-size=6"], folders), "--embedding-size", capsys, runs
    )
    assert "DRML-ProxyAnchor" in err and "divisible" in err
    code, err = run(with_folders("bench", ["--embedding-size=6", "--losses=PFML"], folders), capsys)
    assert code == 0 and runs[0].embedding_size == 6


def test_claims_refuse_an_embedding_size_their_drml_runs_cannot_split(capsys, runs, folders):
    argv = with_folders("claims", ["--embedding-size=6", "--claims=drml-lifts-base"], folders)
    assert_refused(argv, "--embedding-size", capsys, runs, words=("DRML", "divisible"))
    assert_nothing_written(folders)
    argv = with_folders("claims", ["--embedding-size=6", "--claims=pfml-alpha"], folders)
    assert run(argv, capsys)[0] == 0 and runs[0][0].embedding_size == 6


def test_a_loss_name_with_several_settings_is_one_loss(capsys, runs, folders):
    losses = "PFML[alpha=2,proxies_per_class=4],CWMS"
    code, err = run(with_folders("bench", [f"--losses={losses}"], folders), capsys)
    assert code == 0 and not err, err
    assert runs[0].losses == ("PFML[alpha=2,proxies_per_class=4]", "CWMS")


def test_select_refuses_a_tuned_value_and_a_repeated_loss(capsys, runs, folders):
    assert_refused(with_folders("select", ["--losses=PFML[delta=0.3]"], folders), "--losses", capsys, runs)
    assert_refused(with_folders("bench", ["--losses=PFML,PFML"], folders), "--losses", capsys, runs)
    assert_nothing_written(folders)


def test_a_wrong_backbone_is_refused_in_one_line(capsys, runs, folders):
    for command in COMMANDS:
        argv = with_folders(command, ["--backbone=resnet"], folders)
        assert_refused(argv, "--backbone", capsys, runs, words=("convnet",))
    assert_nothing_written(folders)


# --- claims -------------------------------------------------------------------------------------


@FEW
@given(
    st.lists(
        st.text(alphabet=string.ascii_lowercase + "-", min_size=1, max_size=12), min_size=1, max_size=3
    ).filter(lambda ids: any(i not in {c.id for c in table.CLAIMS} for i in ids))
)
def test_an_unknown_claim_id_is_refused(capsys, runs, folders, ids):
    err = assert_refused(
        with_folders("claims", ["--claims=" + ",".join(ids)], folders), "--claims", capsys, runs
    )
    assert "unknown claim" in err and table.CLAIMS[0].id in err  # the ids it knows
    assert_nothing_written(folders)


@FEW
@given(st.text(alphabet=", ", max_size=5))
def test_an_empty_claim_list_is_refused(capsys, runs, folders, text):
    err = assert_refused(with_folders("claims", [f"--claims={text}"], folders), "--claims", capsys, runs)
    assert "names no claim" in err
    assert_nothing_written(folders)


# --- data, device, Ray --------------------------------------------------------------------------


def class_folders(root, classes, images=2):
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(images):
            (root / f"class{c}" / f"{i}.png").write_bytes(b"")
    return root


@pytest.mark.parametrize("command", COMMANDS)
def test_data_that_is_a_file_or_missing_or_too_small_is_refused(capsys, runs, folders, tmp_path, command):
    data = tmp_path / "images.png"
    data.write_bytes(b"")
    err = assert_refused(with_folders(command, ["--data", str(data)], folders), "--data", capsys, runs)
    assert "is a file" in err and "emoji" in err and "one sub-folder per class" in err
    err = assert_refused(
        with_folders(command, ["--data", str(tmp_path / "no")], folders), "--data", capsys, runs
    )
    assert "no such folder" in err and "emoji" in err
    assert_refused(with_folders(command, ["--data", ""], folders), "--data", capsys, runs)
    small = class_folders(tmp_path / "small", cli.MIN_CLASSES - 1)
    (small / "no-image").mkdir()  # a class folder without images does not count
    (small / ".hidden").mkdir()
    (small / ".hidden" / "0.png").write_bytes(b"")
    (small / ".hidden" / "1.png").write_bytes(b"")
    err = assert_refused(with_folders(command, ["--data", str(small)], folders), "--data", capsys, runs)
    assert f"has {cli.MIN_CLASSES - 1} sub-folders" in err
    assert_nothing_written(folders)
    enough = class_folders(tmp_path / "enough", cli.MIN_CLASSES)
    assert run(with_folders(command, ["--data", str(enough)], folders), capsys)[0] == 0 and runs


@FEW
@given(
    st.one_of(
        st.text(max_size=8),
        st.sampled_from(["cuda:x", "CPU", "gpu", "cuda:-1", " cpu", "meta", "0", "cuda:99999"]),
    )
)
def test_a_device_that_is_not_one_available_here_is_refused(capsys, runs, folders, text):
    import torch

    try:
        available = cli.device_available(torch.device(text))
    except (RuntimeError, ValueError, TypeError):  # not a device at all
        available = False
    if available:
        return
    argv = with_folders("bench", [f"--device={text}"], folders)
    assert_refused(argv, "--device", capsys, runs, words=("available here: cpu",))
    assert_nothing_written(folders)


def test_cuda_without_cuda_names_the_devices_there_are(capsys, runs, folders):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    for command in COMMANDS:
        err = assert_refused(with_folders(command, ["--device=cuda"], folders), "--device", capsys, runs)
        assert "not available on this machine; available here: cpu" in err
    assert_nothing_written(folders)


def test_a_device_index_with_ray_is_refused(capsys, runs, folders):
    argv = with_folders("bench", ["--device=cpu:0", "--ray-address=local"], folders)
    assert_refused(argv, "--device", capsys, runs, words=("Ray gives each run its GPU",))


def ray_address(text):
    """Whether ``text`` is 'local', 'auto', HOST:PORT or ray://HOST:PORT (port 1 to 65535), the
    forms docs/cluster.md gives; written here apart from the command's own check."""
    if text in ("local", "auto"):
        return True
    host, _, port = text.removeprefix("ray://").rpartition(":")
    name = all(c.isascii() and (c.isalnum() or c in "._-") for c in host)
    ipv6 = (
        len(host) > 2 and host[0] + host[-1] == "[]" and all(c in string.hexdigits + ":." for c in host[1:-1])
    )
    return bool(host) and (name or ipv6) and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535


@FEW
@given(
    st.one_of(
        st.text(alphabet=st.characters(blacklist_characters="\n"), max_size=12).filter(
            lambda t: not ray_address(t)
        ),
        st.sampled_from(["host:0", "host:65536", "host:", ":6379", "http://h:1", "LOCAL", "h :1", "ray://h"]),
    )
)
def test_a_ray_address_of_another_form_is_refused(capsys, runs, folders, address):
    argv = with_folders("bench", [f"--ray-address={address}"], folders)
    assert_refused(argv, "--ray-address", capsys, runs, words=("HOST:PORT",))
    assert_nothing_written(folders)


def test_a_ray_address_with_a_final_newline_is_refused(capsys, runs, folders):
    argv = with_folders("bench", ["--ray-address=head:6379\n"], folders)
    assert_refused(argv, "--ray-address", capsys, runs, words=("HOST:PORT",))


@pytest.mark.parametrize("command", COMMANDS)
def test_ray_without_the_cluster_extra_names_the_pip_command(capsys, runs, folders, monkeypatch, command):
    monkeypatch.setitem(sys.modules, "ray", None)  # find_spec("ray") is None: not installed
    assert extras.missing_modules("cluster") == ["ray"]
    argv = with_folders(command, ["--ray-address=auto"], folders)
    assert_refused(argv, "--ray-address", capsys, runs, words=('pip install "pml-fieldlosses[cluster]"',))
    assert_nothing_written(folders)


def test_good_ray_addresses_reach_the_run(capsys, runs, folders):
    if extras.missing_modules("cluster"):
        pytest.skip("the cluster extra is not installed")
    for address in (
        "local",
        "auto",
        "10.0.0.1:6379",
        "head-node.example:6379",
        "[::1]:6379",
        "ray://h:10001",
    ):
        assert ray_address(address)
        assert run(with_folders("bench", [f"--ray-address={address}"], folders), capsys)[0] == 0
        assert runs.pop().ray_address == address


# --- folders ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("option", ["--out", "--cache"])
def test_a_folder_option_that_is_a_file_or_under_one_is_refused(capsys, runs, tmp_path, command, option):
    other = "--cache" if option == "--out" else "--out"
    afile = tmp_path / "afile"
    afile.write_text("keep")
    for path in (afile, afile / "sub"):
        argv = [command, option, str(path), other, str(tmp_path / "other")]
        err = assert_refused(argv, option, capsys, runs, code=1, words=(str(afile),))
        assert "file" in err
    assert afile.read_text() == "keep"
    assert run([command, option, "", other, str(tmp_path / "other")], capsys)[0] == 2


def test_a_cache_folder_from_the_environment_that_is_a_file_is_refused(capsys, runs, tmp_path, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.setenv("PML_FIELDLOSSES_CACHE", str(afile))
    argv = ["bench", "--out", str(tmp_path / "out")]
    assert_refused(argv, "$PML_FIELDLOSSES_CACHE", capsys, runs, code=1, words=(str(afile), "is a file"))
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only folder anyway")
@pytest.mark.parametrize("option", ["--out", "--cache"])
def test_a_read_only_folder_is_refused(capsys, runs, tmp_path, option):
    other = "--cache" if option == "--out" else "--out"
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        for path in (folder, folder / "sub"):
            argv = ["bench", option, str(path), other, str(tmp_path / "other")]
            assert_refused(argv, option, capsys, runs, code=1, words=("permission denied",))
        assert not list(folder.iterdir())
    finally:
        folder.chmod(0o755)


@pytest.mark.parametrize("option", ["--out", "--cache"])
def test_a_read_only_file_system_is_refused(capsys, runs, tmp_path, monkeypatch, option):
    """(EROFS, as root too: the write check's temporary file is refused as a read-only mount would.)"""
    from pml_fieldlosses.app import errors

    real = errors.tempfile.mkstemp
    read_only = tmp_path / "mount"

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and str(dir).startswith(str(read_only)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dir))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(errors.tempfile, "mkstemp", mkstemp)
    other = "--cache" if option == "--out" else "--out"
    argv = ["claims", option, str(read_only), other, str(tmp_path / "other")]
    assert_refused(argv, option, capsys, runs, code=1, words=("read-only", str(read_only)))


def test_a_results_folder_that_is_a_file_is_refused(capsys, runs, folders):
    out = folders[0]
    out.mkdir()
    for ids in (None, ["pfml-alpha"]):
        report = report_folder(claims_config(out=str(out)), table.get_claims(ids))
        report.write_text("")
        argv = with_folders("claims", ["--claims", ",".join(ids)] if ids else [], folders)
        assert_refused(argv, "--out", capsys, runs, code=1, words=(str(report), "is a file"))
        report.unlink()
    for command in ("bench", "select"):
        assert run(with_folders(command, ["--losses=PFML"], folders), capsys)[0] == 0
        results = out / runs.pop().folder_name(selection=command == "select")
        results.write_text("")
        argv = with_folders(command, ["--losses=PFML"], folders)
        assert_refused(argv, "--out", capsys, runs, code=1, words=(str(results), "is a file"))


# --- faults of a run ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error, code, words",
    [
        (
            OSError(errno.ENOSPC, "No space left on device", "/data/out/results.csv"),
            1,
            ["results.csv", "disk"],
        ),
        (OSError(errno.EROFS, "Read-only file system", "/data/out/x.json"), 1, ["x.json", "read-only"]),
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "/data/a"), 1, ["/data/a"]),
        (ValueError("a bad image"), 1, ["a bad image", "--traceback"]),
        (RuntimeError("CUDA out of memory"), 1, ["CUDA out of memory"]),
    ],
)
def test_an_error_during_a_run_is_one_line(capsys, monkeypatch, folders, error, code, words):
    def fails(plan):
        raise error

    monkeypatch.setattr(cli, "run_bench_command", fails)
    got, err = run(with_folders("bench", ["--losses=PFML"], folders), capsys)
    assert got == code and err.count("\n") == 1 and "Traceback" not in err, err
    assert all(word in err for word in words), err
    with pytest.raises(type(error)):
        cli.main(["--traceback", *with_folders("bench", ["--losses=PFML"], folders)])


def test_ctrl_c_keeps_its_message_and_code(capsys, monkeypatch, folders):
    def interrupted(plan):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_claims_command", interrupted)
    code, err = run(with_folders("claims", [], folders), capsys)
    assert code == 130 and "finished runs are kept" in err


def test_the_help_says_the_bounds():
    parser = cli.Parser(prog="pml-fieldlosses")
    sub = parser.add_subparsers()
    text = " ".join(cli.bench_parser(sub).format_help().split())
    for option, low, high, _ in INTEGERS:
        assert f"{low} to {high}" in text, option
    assert "[0, 1)" in text
