"""What a sweep writes to TensorBoard, read back with TensorBoard's own reader (and, slow, its web UI)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from chromium_pipe import DEEP_TEXT_JS
from cli_helpers import TINY, events, metrics, tiny_task, train_in_process
from matplotlib import colormaps
from omegaconf import OmegaConf
from PIL import Image
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.hparams import api_pb2, backend_context, metadata
from tensorboard.util import tensor_util

from attnlab.board import hparams as tb_hparams
from attnlab.board import images as tb_images
from attnlab.board.summaries import Summaries
from attnlab.config import registry
from attnlab.sweep import definition
from attnlab.tasks import Task

NORMALIZERS = ("softmax", "linear")
EVAL_STEPS = [4]


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    """normalizer=softmax,linear × trainer.vmap_seeds=2 (seeds 0, 1 as seed<k>/ sub-runs), 2 layers of 2 heads."""
    root = tmp_path_factory.mktemp("tb")
    train_in_process(
        "-m",
        f"normalizer={','.join(NORMALIZERS)}",
        *TINY,
        *tiny_task("mqar"),
        "model.layers=2",
        "trainer.vmap_seeds=2",
        f"hydra.sweep.dir={root / 'sweep'}",
        cwd=root,
    )
    return root / "sweep"


def runs(sweep_dir):
    """{(normalizer, seed): run dir} of the sweep's four runs."""
    out = {}
    for job in sweep_dir.iterdir():
        if job.is_dir():
            for seed_dir in (p for p in job.glob("seed*") if p.is_dir()):
                out[(job.name.split("=", 1)[1], seed_dir.name[len("seed") :])] = seed_dir
    assert sorted(out) == sorted((n, s) for n in NORMALIZERS for s in ("0", "1")), sorted(out)
    return out


def hparams_content(run_dir):
    return events(run_dir).PluginTagToContent("hparams")


def yaml_options(group, choice):
    raw = registry.load(group, choice)
    return {f"{group}.{k}" for k, v in raw.items() if not k.startswith("_") and isinstance(v, (int, float, str, bool))}


def test_hparams_experiment_marks_the_swept_keys_and_declares_every_choices_options(sweep_dir):
    experiments = [
        metadata.parse_experiment_plugin_data(hparams_content(d)[metadata.EXPERIMENT_TAG])
        for d in runs(sweep_dir).values()
    ]
    exp = experiments[0]
    assert all(e == exp for e in experiments)  # whichever run TensorBoard picks, the same experiment
    infos = {h.name: h for h in exp.hparam_infos}
    assert {"normalizer", "seed", "task", "head", "model", "trainer.accelerator", "optim.lr"} <= set(infos)
    for n in NORMALIZERS:  # the union: both normalizers' options are columns in every run
        assert yaml_options("normalizer", n) <= set(infos), yaml_options("normalizer", n) - set(infos)
    assert {n for n, h in infos.items() if h.differs} == {"normalizer", "seed", "task", "head", "model"}
    assert infos["seed"].type == api_pb2.DATA_TYPE_STRING and infos["seed"].WhichOneof("domain") is None
    # Choices list every choice in configs/: a run of another sweep in the same logdir is never filtered out.
    assert [v.string_value for v in infos["normalizer"].domain_discrete.values] == registry.choices("normalizer")
    assert infos["optim.lr"].type == api_pb2.DATA_TYPE_FLOAT64
    assert (infos["optim.lr"].domain_interval.min_value, infos["optim.lr"].domain_interval.max_value) == (3e-3, 3e-3)
    assert [v.bool_value for v in infos["model.qk_norm"].domain_discrete.values] == [False, True]
    assert [m.name.tag for m in exp.metric_infos] == [
        "test/accuracy",
        "val/accuracy",
        "test/loss",
        "val/loss",
        "test/ece",
        "train/nonfinite_steps",
    ]
    # TensorBoard's own ordering (differs first, then by name); the HParams tab shows the first five.
    backend_context._sort_and_reduce_to_hparams_limit(exp, 5)
    assert [h.name for h in exp.hparam_infos] == ["head", "model", "normalizer", "seed", "task"]


def test_sweep_values_read_the_multirun_yaml(tmp_path):
    """Command-line sweeps and sweeper params both count; hydra's own keys and single values do not."""
    task = ["normalizer=softmax,kl", "seed=range(0,3)", "optim.lr=1e-3", "hydra/launcher=joblib,basic"]
    OmegaConf.save(
        {"hydra": {"overrides": {"task": task}, "sweeper": {"params": {"model.d_model": "16,32"}}}},
        tmp_path / "multirun.yaml",
    )
    assert definition.sweep_values(tmp_path) == {
        "normalizer": ["softmax", "kl"],
        "seed": ["0", "1", "2"],
        "model.d_model": ["16", "32"],
    }
    assert definition.sweep_values(tmp_path / "missing") == {}


def test_outside_a_sweep_the_top_level_choices_are_marked():
    own = {"normalizer": "kl", "task": "mqar", "head": "softmax_ce", "model": "tiny", "seed": "3", "optim.lr": 1e-3}
    assert {
        k for k, (_, differs, _) in tb_hparams.declare(own, {}, [3], registry.catalogue({})).items() if differs
    } == set(tb_hparams.TOP_LEVEL)
    vmapped = tb_hparams.declare(own, {}, [3, 4], registry.catalogue({}))
    assert vmapped["seed"] == (["3", "4"], True, [])


def test_swept_keys_come_first_and_top_level_choices_fill_the_five_ticked_columns():
    own = {
        "normalizer": "kl",
        "task": "mqar",
        "head": "softmax_ce",
        "model": "tiny",
        "seed": "0",
        "optim.lr": 1e-3,
        "model.d_model": 32,
        "normalizer.prior": "recency",
    }
    swept = {"optim.lr": ["1e-3", "3e-3"], "seed": ["0", "1"], "model.d_model": ["32", "64"]}
    marked = {
        k for k, (_, differs, _) in tb_hparams.declare(own, swept, [0], registry.catalogue(swept)).items() if differs
    }
    assert marked == {"optim.lr", "seed", "model.d_model", "normalizer", "task"}
    # a kl/softmax sweep: normalizer.prior differs only as a consequence of the choice, and stays unticked
    by_choice = tb_hparams.declare(
        own, {"normalizer": ["kl", "softmax"]}, [0], registry.catalogue({"normalizer": ["kl", "softmax"]})
    )
    assert {k for k, (_, differs, _) in by_choice.items() if differs} == set(tb_hparams.TOP_LEVEL)
    # the swept choices' options are columns (kl's prior), and a choice group's column lists every choice
    assert by_choice["normalizer.prior"][0] == [registry.load("normalizer", "kl")["prior"]]
    assert by_choice["normalizer"][2] == registry.choices("normalizer") and by_choice["optim.lr"][2] == []


def test_a_sweep_over_tasks_declares_every_metric_in_every_run():
    own = {"task": "mqar", "head": "softmax_ce", "seed": "0"}
    logged = {"test/accuracy", "test/loss", "train/nonfinite_steps"}
    assert tb_hparams.metric_list(tb_hparams.declare(own, {}, [0], registry.catalogue({})), logged) == [
        "test/accuracy",
        "test/loss",
        "train/nonfinite_steps",
    ]
    across = tb_hparams.declare(own, {"task": ["mqar", "icl_regression"]}, [0], registry.catalogue({}))
    assert tb_hparams.metric_list(across, logged) == list(tb_hparams.METRICS)


def test_every_run_has_its_own_hparams_and_the_declared_metrics(sweep_dir):
    for (normalizer, seed), run_dir in runs(sweep_dir).items():
        content = hparams_content(run_dir)
        start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
        assert start.hparams["normalizer"].string_value == normalizer
        assert start.hparams["seed"].WhichOneof("kind") == "string_value" and start.hparams["seed"].string_value == seed
        config = json.loads((run_dir / "run.json").read_text())["config"]
        assert start.hparams["optim.lr"].number_value == pytest.approx(config["optim"]["lr"])
        assert start.hparams["model.layers"].number_value == config["model"]["layers"] == 2
        own = yaml_options("normalizer", normalizer) & {k for k, v in start.hparams.items()}
        other = yaml_options("normalizer", ({*NORMALIZERS} - {normalizer}).pop()) - yaml_options(
            "normalizer", normalizer
        )
        assert own and not other & set(start.hparams)  # another choice's options: an empty cell
        end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
        assert end.status == api_pb2.STATUS_SUCCESS
        tags = set(events(run_dir).Tags()["scalars"])
        assert {"test/accuracy", "val/accuracy", "test/loss", "val/loss", "test/ece", "train/nonfinite_steps"} <= tags


def test_per_layer_means_equal_the_mean_of_the_heads(sweep_dir):
    for run_dir in runs(sweep_dir).values():
        acc = events(run_dir)
        layer_tags = [t for t in acc.Tags()["scalars"] if re.fullmatch(r"(attn_\w+|score_grad)/layer_\d", t)]
        assert {"attn_entropy/layer_0", "attn_entropy/layer_1", "attn_max_weight/layer_1"} <= set(layer_tags)
        for tag in layer_tags:
            heads_HK = np.array([[e.value for e in acc.Scalars(f"{tag}/head_{h}")] for h in range(2)], np.float64)
            layer_K = np.array([e.value for e in acc.Scalars(tag)])
            # score_grad/layer_i is the norm over heads, attn_<stat>/layer_i their mean.
            want = np.sqrt((heads_HK**2).sum(0)) if tag.startswith("score_grad") else heads_HK.mean(0)
            np.testing.assert_allclose(layer_K, want, rtol=1e-5, atol=1e-7, err_msg=tag)


def test_duplicated_and_meaningless_series_are_gone(sweep_dir):
    for (normalizer, _), run_dir in runs(sweep_dir).items():
        acc, m = events(run_dir), metrics(run_dir)
        tags = set(acc.Tags()["scalars"])
        assert "val/loss" in tags and "val/nll" not in tags and "test/nll" not in tags  # nll is the loss here
        assert m["final"]["val/nll"] == pytest.approx(m["final"]["val/loss"])  # metrics.json keys unchanged
        assert not any(t.startswith("baseline/") for t in tags)
        assert acc.Scalars("baseline_test/accuracy")[-1].value == pytest.approx(m["baseline"]["baseline/accuracy"])
        assert acc.Scalars("baseline_val/accuracy")[-1].value == pytest.approx(m["baseline"]["baseline_val/accuracy"])
        assert ("grad_norm/beta" in tags) == (normalizer == "softmax")  # linear attention has no β


def test_attention_map_images_are_rgb_labelled_and_readable(sweep_dir):
    shapes = set()
    for run_dir in runs(sweep_dir).values():
        acc = events(run_dir)
        cards = [f"attn_map/layer_{i}/head_{h}" for i in range(2) for h in range(2)]  # one card per head
        assert sorted(t for t in acc.Tags()["images"]) == cards
        for tag in cards:
            imgs = acc.Images(tag)
            assert [e.step for e in imgs] == EVAL_STEPS
            png = Image.open(io.BytesIO(imgs[-1].encoded_image_string))
            assert png.mode == "RGB" and (png.width, png.height) == (imgs[-1].width, imgs[-1].height)
            assert png.height >= 200 and 200 <= png.width < 2 * 200  # one head of at least 200 px
            shapes.add(png.size)
    assert len(shapes) == 1  # every run's map has the same layout


@pytest.mark.parametrize("scale", ["row", "log", "max"])
def test_rendered_map_has_head_titles_a_colour_bar_and_viridis_cells(scale):
    rng = np.random.default_rng(0)
    w_NTS = rng.dirichlet(np.ones(5) * 0.3, size=(2, 5))
    fig = tb_images.render(w_NTS, scale, "layer 0")
    rgb = tb_images.to_rgb(fig)
    assert rgb.dtype == np.uint8 and rgb.ndim == 3 and rgb.shape[2] == 3
    heads = [ax for ax in fig.axes if ax.get_title().startswith("head")]
    assert [ax.get_title() for ax in heads] == ["head 0", "head 1"]
    assert len(fig.axes) == 3 and fig.axes[2].get_ylabel()  # the colour bar, with its label
    # The reference: each scale's closed form through matplotlib's viridis, read at each cell's centre.
    ref = {
        "row": w_NTS / w_NTS.max(-1, keepdims=True),
        "log": (np.log10(np.maximum(w_NTS, 1e-4)) + 4) / 4,
        "max": w_NTS / w_NTS.max((1, 2), keepdims=True),
    }[scale]
    height = rgb.shape[0]
    for h, ax in enumerate(heads):
        for t in range(5):
            for s in range(5):
                x, y = ax.transData.transform((s, t))
                got = rgb[int(height - y), int(x)].astype(float)
                want = np.array(colormaps["viridis"](ref[h, t, s])[:3]) * 255
                np.testing.assert_allclose(got, want, atol=3, err_msg=f"{scale} head {h} cell {t},{s}")


def test_block_mean_matches_a_loop_over_blocks():
    rng = np.random.default_rng(1)
    w_NTS = rng.random((2, 600, 515))
    small, f = tb_images.block_mean(w_NTS)
    assert f == 3 and small.shape == (2, 200, 172)  # ceil(600/256) = 3; the last key block holds 2 columns
    want = np.empty_like(small)
    for i in range(200):
        for j in range(172):
            want[:, i, j] = w_NTS[:, 3 * i : 3 * i + 3, 3 * j : 3 * j + 3].mean((1, 2))
    np.testing.assert_allclose(small, want, rtol=1e-12)
    same, one = tb_images.block_mean(w_NTS[:, :256, :100])
    assert one == 1 and np.array_equal(same, w_NTS[:, :256, :100])


@pytest.mark.parametrize("shape, labels", [((2, 600, 515), None), ((2, 6, 6), list("ab␣↵cd"))])
def test_a_kept_figure_drawn_again_equals_a_fresh_drawing(shape, labels):
    """tb_images.Figures keeps each layer's figure and draws the next map into it: pixel for pixel what a
    new figure draws, for block-mean maps and labelled small ones, in every scale."""
    rng = np.random.default_rng(3)
    maps = [rng.dirichlet(np.ones(shape[-1]) * 0.3, size=shape[:2]) for _ in range(3)]
    kept = tb_images.Figures()
    for scale in ("row", "log"):
        for i, m in enumerate(maps):
            got = kept.image(0, m, scale, f"layer 0, step {10**i}", labels)
            want = tb_images.Figures().image(0, m, scale, f"layer 0, step {10**i}", labels)
            assert got.shape == want.shape and np.array_equal(got, want), (scale, i)
    fig = kept.figures[0][0]
    assert fig.get_suptitle().startswith("layer 0, step 100")


def test_images_and_histograms_are_drawn_in_the_background_and_land_in_the_event_file(tmp_path, monkeypatch):
    import threading

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    drawn, render = [], tb_images.render

    def spy(values_NTS, scale, title, labels=None, first_head=0):
        drawn.append((values_NTS.shape, title, threading.current_thread() is threading.main_thread()))
        return render(values_NTS, scale, title, labels=labels, first_head=first_head)

    monkeypatch.setattr(tb_images, "render", spy)
    rng = np.random.default_rng(2)
    maps_LBNTS = rng.dirichlet(np.ones(1024), size=(2, 1, 2, 1024)).astype(np.float32)
    s = Summaries(str(tmp_path))
    s.attention_images(maps_LBNTS, 7)
    s.histogram("hist/beta", [1.0, 2.0, 3.0], 7)
    s.close()
    assert drawn == [
        ((1, 256, 256), f"layer {i} head {h}, step 7, row scale, 4×4 block means", False)
        for i in range(2)
        for h in range(2)
    ]
    acc = EventAccumulator(str(tmp_path), size_guidance={"images": 0, "histograms": 0})
    acc.Reload()
    assert sorted(acc.Tags()["images"]) == [f"attn_map/layer_{i}/head_{h}" for i in range(2) for h in range(2)]
    assert [e.step for e in acc.Images("attn_map/layer_1/head_1")] == [7]
    hist = acc.Histograms("hist/beta")
    assert [e.step for e in hist] == [7] and hist[0].histogram_value.num == 3


def test_shown_text_is_written_for_a_task_that_decodes_and_only_then(tmp_path):
    class Bytes(Task):
        is_text = True

        def decode(self, tokens_T):
            return bytes(int(t) for t in tokens_T).decode()

    for name, task in (("lm", Bytes()), ("mqar", Task())):
        writer = Summaries(str(tmp_path / name))
        writer.shown_text(task, np.frombuffer(b"attention", np.uint8))
        writer.close()
    acc = events(tmp_path / "lm")
    (event,) = acc.Tensors("example/text/text_summary")
    assert tensor_util.make_ndarray(event.tensor_proto).item() == b"attention"
    assert acc.SummaryMetadata("example/text/text_summary").plugin_data.plugin_name == "text"
    assert events(tmp_path / "mqar").Tags()["tensors"] == []


def test_unknown_attn_map_scale_exits_2_naming_the_key(tmp_path):
    proc = train_in_process(
        *TINY,
        *tiny_task("mqar"),
        "trainer.attn_map_scale=bright",
        f"hydra.run.dir={tmp_path / 'r'}",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 2
    assert "trainer.attn_map_scale='bright' is invalid; allowed: row, log, max" in proc.stderr


def test_custom_scalars_layout_overlays_one_chart_per_layer_statistic(sweep_dir):
    for run_dir in runs(sweep_dir).values():
        acc = events(run_dir)
        raw = tensor_util.make_ndarray(acc.Tensors("custom_scalars__config__")[0].tensor_proto).item()
        layout = layout_pb2.Layout.FromString(raw)
        tags = acc.Tags()["scalars"]
        assert [c.title for c in layout.category] == [
            "losses, entropy and gradient norms",
            "layer 0",
            "layer 1",
            "global",
        ]
        assert [c.title for c in layout.category[0].chart] == [
            "train loss",
            "val loss",
            "val accuracy",
            "layer 0: entropy",
            "layer 0: gradient norm",
            "layer 1: entropy",
            "layer 1: gradient norm",
        ]
        for category in layout.category:
            for chart in category.chart:
                (pattern,) = chart.multiline.tag
                assert len([t for t in tags if re.match(pattern, t)]) == 1, (category.title, chart.title)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ~8 s beside the sweep fixture (TensorBoard start, page load): not marked slow.
# The value of the settings pane's smoothing input (a number field beside its slider), through shadow roots.
SMOOTHING_JS = r"""(() => { let found = null;
  const walk = (n) => { if (found !== null) return; if (n.shadowRoot) walk(n.shadowRoot);
    if (n.tagName === 'INPUT' && (n.closest && n.closest('.smoothing, [class*=smoothing]'))) {
      found = n.value; return; }
    for (const c of n.children || []) walk(c); };
  walk(document); return found; })()"""


def _chromium():
    """The headless browser; a failure, never a skip, where `chromium` is missing (`make test` installs it)."""
    if shutil.which("chromium") is None:
        pytest.fail(
            "no `chromium` on PATH for the headless-browser tests: `make test` installs Debian's package "
            "(apt-get update && apt-get install -y chromium)"
        )
    from chromium_pipe import Chromium

    return Chromium(width=1400, height=2400)  # tall: Time Series draws only the cards in view


@contextlib.contextmanager
def _tensorboard(logdir):
    """A TensorBoard server on a free local port, answering; yields its port."""
    port = _free_port()
    board = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugins_listing", timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline, "tensorboard did not answer in 60 s"
                time.sleep(1)
        yield port
    finally:
        board.kill()
        board.wait()


@contextlib.contextmanager
def _browser():
    browser = _chromium()
    try:
        yield browser
    finally:
        browser.close()


def test_hparams_tab_in_headless_chromium_opens_on_the_swept_columns(sweep_dir, tmp_path):
    with _tensorboard(sweep_dir) as port, _browser() as browser:
        page = browser.open(f"http://127.0.0.1:{port}/#hparams")
        texts = browser.wait_for_text(page, "Trial ID")
        browser.screenshot(page, tmp_path / "hparams.png")
    leaves = [t for _, t in texts]
    assert "Trial ID" in leaves, leaves[:80]
    # The table header: Trial ID, Show Metrics, then the hparam columns shown by default. TensorBoard 2.21 lists
    # them by name, not in the declared order: the five ticked ones (the swept normalizer, the vmapped seed, the
    # top-level choices), and no other option.
    header = leaves[leaves.index("Trial ID") + 2 :]
    assert header[:5] == ["head", "model", "normalizer", "seed", "task"], header[:8]
    assert not any("." in h for h in header[:8]), header[:8]


# The URL a sweep prints: smoothing off, runs coloured by normalizer (regex:[_,]normalizer=([^,/]+)), Time Series.
README_URL = "?smoothing=0&runColorGroup=regex:%5B_%2C%5Dnormalizer%3D(%5B%5E%2C%2F%5D%2B)#timeseries"


@pytest.mark.long  # the browser runs by default in test_hparams_tab_in_headless_chromium_opens_on_the_swept_columns
def test_time_series_opens_on_attention_entropy_unsmoothed_with_a_card_per_head(sweep_dir, tmp_path):
    with _tensorboard(sweep_dir) as port, _browser() as browser:
        page = browser.open(f"http://127.0.0.1:{port}/{README_URL}")
        browser.wait_for_text(page, "/attn_entropy_layer_1")  # a card title: the group's name, then the rest
        time.sleep(2)
        leaves = [t for _, t in browser.evaluate(page, DEEP_TEXT_JS)]
        smoothing = browser.evaluate(page, SMOOTHING_JS)
        browser.screenshot(page, tmp_path / "timeseries.png")
        images = browser.open(f"http://127.0.0.1:{port}/?tagFilter=attn_map#timeseries")
        browser.wait_for_text(images, "/head_1")
        image_leaves = [t for _, t in browser.evaluate(images, DEEP_TEXT_JS)]
    # no filter typed: the first group, 0_main, opens on each layer's entropy beside the losses
    titles = [t for t in leaves if t.startswith("/")]
    assert "0_main" in leaves and leaves.index("0_main") < leaves.index("/attn_entropy_layer_0"), titles[:8]
    assert titles[:7] == [
        "/attn_entropy_layer_0",
        "/attn_entropy_layer_1",
        "/grad_norm_layer_0",
        "/grad_norm_layer_1",
        "/train_loss",
        "/val_accuracy",
        "/val_loss",
    ], titles[:8]
    assert smoothing == "0", smoothing  # the settings pane's smoothing field reads the URL's 0 (default 0.6)
    cards = {(a, b) for a, b in zip(image_leaves, image_leaves[1:]) if a.startswith("attn_map/")}
    expected = {(f"attn_map/layer_{i}", f"/head_{h}") for i in range(2) for h in range(2)}
    assert "16 cards" in image_leaves  # 4 runs × 2 layers × 2 heads, one image card each (paged, 12 a page)
    assert {("attn_map/layer_0", "/head_0"), ("attn_map/layer_0", "/head_1")} <= cards <= expected, sorted(cards)


# The Custom Scalars URL a sweep prints: its smoothing slider is the legacy dashboard's own, kept in the fragment.
CUSTOM_SCALARS_URL = "#custom_scalars&_smoothingWeight=0"
# The value of the Custom Scalars smoothing slider (paper-slider#slider), through shadow roots.
SLIDER_JS = r"""(() => { let found = null;
  const walk = (n) => { if (found !== null) return; if (n.shadowRoot) walk(n.shadowRoot);
    if (n.tagName === 'PAPER-SLIDER' && n.id === 'slider') { found = String(n.value); return; }
    for (const c of n.children || []) walk(c); };
  walk(document); return found; })()"""


@pytest.mark.long  # the browser runs by default in test_hparams_tab_in_headless_chromium_opens_on_the_swept_columns
def test_custom_scalars_opens_unsmoothed_on_entropy_and_gradient_norm_per_layer(sweep_dir):
    with _tensorboard(sweep_dir) as port, _browser() as browser:
        plain = browser.open(f"http://127.0.0.1:{port}/#custom_scalars")
        browser.wait_for_text(plain, "layer 0: gradient norm")
        time.sleep(2)
        default = browser.evaluate(plain, SLIDER_JS)
        page = browser.open(f"http://127.0.0.1:{port}/{CUSTOM_SCALARS_URL}")
        browser.wait_for_text(page, "layer 0: gradient norm")
        time.sleep(2)
        leaves = [t for _, t in browser.evaluate(page, DEEP_TEXT_JS) if len(t) < 80]
        smoothing = browser.evaluate(page, SLIDER_JS)
    assert (default, smoothing) == ("0.6", "0")  # TensorBoard's default, and the printed URL's
    first = leaves.index("losses, entropy and gradient norms")
    charts = [t for t in leaves[first:] if t.startswith(("train loss", "val ", "layer 0:", "layer 1:"))]
    assert charts[:7] == [
        "train loss",
        "val loss",
        "val accuracy",
        "layer 0: entropy",
        "layer 0: gradient norm",
        "layer 1: entropy",
        "layer 1: gradient norm",
    ], charts[:10]


def _report(sweep, out):
    """`attnlab-report SWEEP --out OUT` in a fresh interpreter, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "attnlab.report.cli", str(sweep), "--out", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        timeout=300,
    )


def test_a_report_on_healthy_runs_prints_the_report_and_nothing_on_stderr(sweep_dir, tmp_path):
    proc = _report(sweep_dir, tmp_path / "report")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.startswith("# ") and "4 of 4 runs completed" in proc.stdout, proc.stdout[:300]


def test_a_report_says_on_stderr_what_it_could_not_read(sweep_dir, tmp_path):
    broken = tmp_path / "sweep"
    shutil.copytree(sweep_dir, broken, ignore=shutil.ignore_patterns("report"))
    (no_events, bad_json) = sorted(runs(broken).values())[:2]
    for f in no_events.glob("events.out.tfevents.*"):
        f.unlink()
    (bad_json / "metrics.json").write_text('{"status": "compl')
    proc = _report(broken, tmp_path / "report")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert f"attnlab-report: warning: {no_events} has no TensorBoard event file; its curves are left out" in lines
    assert (
        f"attnlab-report: warning: {bad_json / 'metrics.json'} does not parse as JSON; the run counts as unreadable"
    ) in lines
    assert len(lines) == 2, lines


def test_described_scalars_carry_the_scalars_plugin_so_readers_do_not_warn(sweep_dir):
    acc = events(runs(sweep_dir)[("softmax", "0")])
    for tag in ("attn_entropy/layer_0", "train/loss", "0_main/val_loss"):
        meta = acc.SummaryMetadata(tag)
        assert meta.plugin_data.plugin_name == "scalars", tag
        assert meta.summary_description, tag
    assert "H / log n" in acc.SummaryMetadata("attn_entropy/layer_0").summary_description
