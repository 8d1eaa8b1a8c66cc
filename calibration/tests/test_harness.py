"""Tests of calibration/harness.py that need no GPU and no torch.

Run: python3 -m unittest discover -s calibration/tests   (from the repository root)
Set MORO_UPDATE_FIXTURES=1 to rewrite tests/fixtures/sample_rows.jsonl after a deliberate
change of the row format.
"""

import contextlib
import dataclasses
import io
import json
import os
import sys
import tempfile
import types
import unittest
import unittest.mock

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "calibration"))

import harness as h  # noqa: E402

FIXTURES = os.path.join(HERE, "fixtures")
GIB = h.GIB
MIB = h.MIB

MACHINE = {
    "gpu_name": "NVIDIA H200",
    "uuid": "GPU-00000000-0000-0000-0000-000000000000",
    "total_bytes": 150_754_820_096,
    "compute_capability": [9, 0],
    "context_bytes": 520 * MIB,
    "context_source": "nvml per-process",
    "cublas_workspace_bytes": 32 * MIB,
    "driver": "570.124.06",
    "versions": {"torch": "2.6.0", "transformers": "4.51.3", "peft": "0.15.2",
                 "accelerate": "1.6.0", "bitsandbytes": "0.45.5", "flash_attn": None,
                 "trl": "0.17.0", "pynvml": "12.0.0", "cuda": "12.4"},
    "device_source": "nvml",
    "measured_at": "2026-01-02T03:04:05Z",
    "harness_version": 2,
}


def fake_result(job, layers=None, alloc=20 * GIB, outcome="ok"):
    full = 32 if "8B" in job.model else 80
    r = {"outcome": outcome, "layers": layers or full, "layers_full": full,
         "layer_key": "num_hidden_layers", "model_type": "llama", "steps": 3,
         "params": 8_030_261_248, "trainable_params": 41_943_040, "wall_s": 12.5,
         "memory_limit_bytes": 140 * GIB}
    if outcome == "ok":
        r.update({"allocated_bytes": alloc, "reserved_bytes": alloc + alloc // 16,
                  "device_bytes": alloc + alloc // 16 + 900 * MIB,
                  "nonalloc_bytes": 900 * MIB, "requested_bytes": alloc - MIB,
                  "device_source": "nvml per-process", "load_allocated_bytes": alloc // 2,
                  "alloc_retries": 0})
    else:
        r.update({"error": "CUDA out of memory. Tried to allocate 2.00 GiB",
                  "allocated_bytes": alloc, "reserved_bytes": alloc})
    return r


def sample_rows():
    """Rows the harness writes for a few jobs with made-up measurements."""
    g = h.grid("full")
    by_why = {j.why: j for j in g}
    qlora8, full8, qlora70, lora8 = g[0], g[1], g[2], g[3]
    inf = [j for j in g if j.method == "inference"][0]
    rows = []
    rows += h.build_rows(qlora8, fake_result(qlora8, alloc=int(12.4 * GIB)), MACHINE, "2026-01")
    rows += h.build_rows(lora8, fake_result(lora8, alloc=int(18.9 * GIB)), MACHINE, "2026-01")
    rows += h.build_rows(full8, fake_result(full8, alloc=int(70.2 * GIB)), MACHINE, "2026-01")
    rows += h.build_rows(qlora70, fake_result(qlora70, layers=40, alloc=int(30.1 * GIB)),
                         MACHINE, "2026-01")
    rows += h.build_rows(inf, fake_result(inf, alloc=int(15.3 * GIB)), MACHINE, "2026-01")
    nockpt = by_why["knob: no gradient checkpointing"]
    rows += h.build_rows(nockpt, fake_result(nockpt, alloc=int(31.0 * GIB)), MACHINE, "2026-01")
    fp32 = by_why["knob: full FT in fp32"]
    rows += h.build_rows(fp32, fake_result(fp32, outcome="OOM", alloc=int(139 * GIB)), MACHINE,
                         "2026-01")
    return rows


class GridTest(unittest.TestCase):
    def test_order_size_determinism(self):
        g = h.grid("full")
        self.assertGreaterEqual(len(g), 35)
        self.assertLessEqual(len(g), 60)
        # The canonical jobs first: 7B-class QLoRA, 7B-class full FT, 70B-class QLoRA scaled.
        self.assertEqual((g[0].method, g[0].quant), ("qlora", "nf4-dq"))
        self.assertIn("8B", g[0].model)
        self.assertEqual(g[1].method, "full")
        self.assertIn("8B", g[1].model)
        self.assertEqual((g[2].method, g[2].layers), ("qlora", "auto"))
        self.assertIn("70B", g[2].model)
        keys = [j.key() for j in g]
        self.assertEqual(len(keys), len(set(keys)), "job keys are unique")
        self.assertEqual(len({j.short_id() for j in g}), len(g), "short ids are unique")
        self.assertEqual(keys, [j.key() for j in h.grid("full")], "deterministic")
        self.assertEqual(g[0].short_id(), h.grid("full")[0].short_id())
        # Keys do not change silently (resumption depends on them).
        self.assertEqual(
            g[0].key(),
            "meta-llama/Llama-3.1-8B|qlora|q=nf4-dq|bf16-mixed|b1|s2048|adamw_torch_fused|ckpt|"
            "sdpa|r16/a32/d0/q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj|Lfull")

    def test_knobs_one_at_a_time(self):
        g = h.grid("full")
        base = g[3]
        self.assertEqual(base.method, "lora")
        fields = [f.name for f in dataclasses.fields(h.Job) if f.name not in ("quick", "why")]
        for j in g[4:18]:
            diff = [f for f in fields if getattr(j, f) != getattr(base, f)]
            self.assertTrue(1 <= len(diff) <= 3, (j.why, diff))

    def test_quick_grid(self):
        q = h.grid("quick")
        self.assertEqual([j.key() for j in q], [j.key() for j in h.grid("full") if j.quick])
        self.assertTrue(5 <= len(q) <= 10)
        self.assertEqual(q[:3], h.grid("full")[:3])
        with self.assertRaises(ValueError):
            h.grid("nope")

    def test_every_model_has_a_config(self):
        cfgs = os.path.join(ROOT, "data", "models")
        for j in h.grid("full"):
            cfg = h.load_config(cfgs, j.model)
            self.assertGreater(h.full_layers(cfg), 0, j.model)

    def test_select(self):
        g = h.grid("full")
        self.assertTrue(all("qlora" in j.key() for j in h.select(g, r"\|qlora\|", None, None)))
        self.assertEqual(len(h.select(g, None, 3, None)), 3)
        pinned = h.select(g, None, 2, 4)
        self.assertEqual([j.layers for j in pinned], [4, 4])
        self.assertIn("|L4", pinned[0].key())
        # By the short ids the plan prints.
        ids = [g[0].short_id(), g[5].short_id()]
        self.assertEqual(h.select(g, "|".join(ids), None, None), [g[0], g[5]])

    def test_plan_without_torch(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(h.main(["--plan"]), 0)
        text = out.getvalue()
        self.assertEqual(len(text.strip().splitlines()), len(h.grid("full")) + 1)
        self.assertIn("canonical: 70B-class QLoRA", text)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(h.main(["--plan", "--json", "--grid", "quick"]), 0)
        docs = [json.loads(line) for line in out.getvalue().splitlines()]
        self.assertEqual([d["key"] for d in docs], [j.key() for j in h.grid("quick")])
        self.assertNotIn("torch", sys.modules)


class ConfigTest(unittest.TestCase):
    def test_layers(self):
        cfg = {"model_type": "llama", "num_hidden_layers": 32, "max_window_layers": 28,
               "layer_types": ["full_attention"] * 32}
        cut = h.with_layers(cfg, 4)
        self.assertEqual((cut["num_hidden_layers"], cut["max_window_layers"]), (4, 4))
        self.assertEqual(len(cut["layer_types"]), 4)
        self.assertEqual(cfg["num_hidden_layers"], 32, "the original is untouched")
        self.assertEqual(h.with_layers(cfg, None), cfg)
        self.assertEqual(h.layer_key({"n_layer": 12}), "n_layer")
        nested = {"model_type": "gemma3", "text_config": {"num_hidden_layers": 34}}
        self.assertEqual(h.full_layers(nested), 34)
        self.assertEqual(h.with_layers(nested, 2)["text_config"]["num_hidden_layers"], 2)
        with self.assertRaises(h.HarnessError):
            h.layer_key({})


class RowTest(unittest.TestCase):
    def test_three_levels(self):
        job = h.grid("full")[0]
        rows = h.build_rows(job, fake_result(job), MACHINE, "2026-01")
        self.assertEqual([r["level"] for r in rows], ["allocated", "reserved", "device"])
        for r in rows:
            self.assertEqual(r["job_key"], job.key())
            self.assertEqual(r["outcome"], "ok")
            self.assertEqual(r["per_gpu_gib"], r["measured_gib"])
            self.assertEqual(r["measured_value"], r["calibration"][r["level"] + "_bytes"])
            self.assertEqual(r["model_hf_id"], job.model)
            self.assertNotIn("model_overrides", r)
        allocated, reserved, device = (r["metric"].lower() for r in rows)
        # The keywords `moro validate` reads the level from.
        self.assertIn("max_memory_allocated", allocated)
        self.assertNotIn("reserved", allocated)
        self.assertNotIn("nvidia", allocated)
        self.assertTrue(reserved.startswith("torch.cuda.max_memory_reserved"))
        self.assertNotIn("alloc", reserved)
        self.assertIn("nvml", device)
        self.assertEqual(len({r["id"] for r in rows}), 3)
        self.assertNotIn("trl", rows[0]["framework_version"], "the harness does not use TRL")
        self.assertIn("transformers 4.51.3", rows[0]["framework_version"])
        self.assertEqual(rows[0]["quantization"]["double_quant"], True)
        self.assertEqual(rows[0]["lora"]["r"], 16)

    def test_kept_load_cache_rows_are_their_own(self):
        job = h.grid("full")[0]
        res = fake_result(job)
        res.update(load_cache_kept=True, load_live_bytes=5 * GIB, load_reserved_bytes=7 * GIB,
                   load_peak_reserved_bytes=7 * GIB)
        kept = h.build_rows(job, res, MACHINE, "2026-01")
        plain = h.build_rows(job, fake_result(job), MACHINE, "2026-01")
        self.assertEqual([r["id"] for r in kept],
                         [r["id"].replace(job.short_id(), job.short_id() + "-kept")
                          for r in plain])
        self.assertEqual(kept[1]["calibration"]["load_cache"], "kept")
        self.assertEqual(kept[1]["calibration"]["load_reserved_bytes"], 7 * GIB)
        self.assertEqual(plain[1]["calibration"]["load_cache"], "emptied")

    def test_oom_and_overrides(self):
        job = h.grid("full")[2]
        rows = h.build_rows(job, fake_result(job, layers=40, outcome="OOM"), MACHINE)
        self.assertEqual(len(rows), 1)
        self.assertEqual(rows[0]["outcome"], "OOM")
        self.assertIsNone(rows[0]["per_gpu_gib"])
        self.assertEqual(rows[0]["model_overrides"], {"num_hidden_layers": 40})
        self.assertIn("40 of 80", rows[0]["notes"])

    def test_varying_lengths_row(self):
        """A job of batches of varying length: its key names the lengths, its row's length is
        the longest and says it is random tokens with no mask (moro reads such a row as
        packed: no attention mask)."""
        jobs = [j for j in h.grid("full") if j.lengths]
        self.assertEqual(len(jobs), 3)
        for job in jobs:
            self.assertEqual(max(job.lengths), job.seq, job.why)
            self.assertEqual(len(job.lengths), 16)
            self.assertTrue(job.key().endswith("|lengths=" + ",".join(map(str, job.lengths))))
            self.assertEqual(h.Job.from_dict(job.to_dict()), job)
            r = h.build_rows(job, fake_result(job), MACHINE)[0]
            self.assertEqual(r["seq_len"], job.seq)
            self.assertIn("random tokens", r["seq_len_kind"])
            self.assertIn("one step per length", r["seq_len_kind"])

    def test_inference_row(self):
        job = [j for j in h.grid("full") if j.method == "inference"][0]
        r = h.build_rows(job, fake_result(job), MACHINE)[0]
        self.assertEqual(r["inference"]["max_new_tokens"], job.new_tokens)
        self.assertEqual(r["seq_len"], job.seq + job.new_tokens)
        self.assertIsNone(r["optimizer"])

    def test_sample_rows_fixture(self):
        """The fixture `moro validate` is tested on (crates/moro/tests/calibrate.rs) is what
        the harness writes today."""
        rows = sample_rows()
        text = "".join(json.dumps(r) + "\n" for r in rows)
        path = os.path.join(FIXTURES, "sample_rows.jsonl")
        mpath = os.path.join(FIXTURES, "sample_rows.jsonl.machine.json")
        if os.environ.get("MORO_UPDATE_FIXTURES"):
            h.write_atomic(path, text)
            h.write_atomic(mpath, json.dumps(MACHINE, indent=2) + "\n")
        with open(path, encoding="utf-8") as f:
            self.assertEqual(f.read(), text, "run with MORO_UPDATE_FIXTURES=1 after a "
                                             "deliberate row format change")
        with open(mpath, encoding="utf-8") as f:
            self.assertEqual(json.load(f), MACHINE)


class ResumeTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.out = os.path.join(self.tmp.name, "rows.jsonl")
        self.quiet = unittest.mock.patch.object(h, "log", lambda msg: None)
        self.quiet.start()

    def tearDown(self):
        self.quiet.stop()
        self.tmp.cleanup()

    def args(self, **kw):
        a = h.parse_args(["--output", self.out, "--no-moro",
                          "--configs", os.path.join(ROOT, "data", "models")])
        for k, v in kw.items():
            setattr(a, k, v)
        return a

    def fake_smi(self, free=100 * GIB):
        total = 141 * GIB
        return lambda device: types.SimpleNamespace(memory=lambda: (total - free, total))

    def test_done_keys_ignores_a_torn_line(self):
        job = h.grid("full")[0]
        rows = h.build_rows(job, fake_result(job), MACHINE)
        with open(self.out, "w") as f:
            f.write(json.dumps(rows[0]) + "\n" + '{"job_key": "torn li')
        self.assertEqual(h.done_keys(self.out), {job.key(): "ok"})
        job2 = h.grid("full")[1]
        h.append_rows(self.out, h.build_rows(job2, fake_result(job2), MACHINE))
        keys = h.done_keys(self.out)
        self.assertEqual(set(keys), {job.key(), job2.key()})
        with open(self.out) as f:
            lines = f.read().splitlines()
        self.assertEqual(len(lines), 5, "old lines kept, torn line ended, 3 new rows")
        self.assertEqual(h.done_keys(os.path.join(self.tmp.name, "none.jsonl")), {})

    def test_resume_skips_measured_jobs(self):
        jobs = h.grid("quick")
        ran = []

        def runner(job, layers, opts, timeout):
            ran.append(job.key())
            return fake_result(job, layers), ""

        # A partial file: the first two jobs were measured by an earlier, interrupted run.
        for j in jobs[:2]:
            h.append_rows(self.out, h.build_rows(j, fake_result(j), MACHINE))
        with open(self.out, "a") as f:
            f.write('{"job_key": "' + jobs[2].key()[:20])  # killed mid-write elsewhere
        counts = h.run_grid(self.args(), jobs, probe=lambda: MACHINE, runner=runner,
                            smi_factory=self.fake_smi())
        self.assertEqual(counts["already"], 2)
        self.assertEqual(ran, [j.key() for j in jobs[2:]])
        self.assertEqual(counts["ran"], len(jobs) - 2)
        self.assertEqual(set(h.done_keys(self.out)), {j.key() for j in jobs})
        self.assertTrue(os.path.exists(self.out + ".machine.json"))
        # A second run has nothing to do and never probes the GPU.
        ran.clear()

        def no_probe():
            raise AssertionError("probed")

        counts = h.run_grid(self.args(), jobs, probe=no_probe, runner=runner,
                            smi_factory=self.fake_smi())
        self.assertEqual((ran, counts["already"]), ([], len(jobs)))

    def test_budget(self):
        jobs = h.grid("quick")
        now = [0.0]

        def runner(job, layers, opts, timeout):
            now[0] += 100
            return fake_result(job), ""

        counts = h.run_grid(self.args(budget_seconds=250, min_job_seconds=45), jobs,
                            probe=lambda: MACHINE, runner=runner, smi_factory=self.fake_smi(),
                            clock=lambda: now[0])
        self.assertEqual(counts["ran"], 3, "starts jobs at t=0, 100, 200; not at 300")

    def test_oom_is_recorded_and_auto_jobs_shrink(self):
        full8 = h.grid("full")[1]
        self.assertEqual(full8.layers, "auto")
        calls = []

        def runner(job, layers, opts, timeout):
            calls.append(layers)
            n = layers or 32
            if n > 16:
                return fake_result(job, n, outcome="OOM"), ""
            return fake_result(job, n), ""

        counts = h.run_grid(self.args(), [full8], probe=lambda: MACHINE, runner=runner,
                            smi_factory=self.fake_smi())
        self.assertEqual(calls, [None, 21, 14])
        self.assertEqual((counts["oom"], counts["ran"]), (2, 1))
        rows = [json.loads(line) for line in open(self.out)]
        self.assertEqual([r["outcome"] for r in rows], ["OOM", "OOM", "ok", "ok", "ok"])
        self.assertEqual(rows[2]["model_overrides"], {"num_hidden_layers": 14})

    def test_failed_job_writes_nothing(self):
        job = h.grid("full")[0]
        counts = h.run_grid(self.args(), [job], probe=lambda: MACHINE,
                            runner=lambda *a: (None, "worker exited with status 1"),
                            smi_factory=self.fake_smi())
        self.assertEqual(counts["failed"], 1)
        self.assertFalse(os.path.exists(self.out))

    def test_missing_packages_skip(self):
        job = [j for j in h.grid("full") if j.attn == "flash_attention_2"][0]
        counts = h.run_grid(self.args(), [job], probe=lambda: MACHINE,
                            runner=lambda *a: self.fail("ran"), smi_factory=self.fake_smi())
        self.assertEqual(counts["skipped"], 1)


class SafetyTest(unittest.TestCase):
    CFG = {"model_type": "llama", "num_hidden_layers": 80}

    def test_fits_as_is(self):
        job = h.grid("full")[2]
        self.assertEqual(h.choose_layers(job, self.CFG, 100 * GIB, lambda n: 50 * GIB), (None, ""))

    def test_auto_scales_down(self):
        job = h.grid("full")[2]
        # 0.5 GiB per layer + 5 GiB: 30 GiB free fits 50 layers.
        pred = lambda n: int((5 + 0.5 * n) * GIB)  # noqa: E731
        self.assertEqual(h.choose_layers(job, self.CFG, 30 * GIB, pred), (50, ""))
        n, why = h.choose_layers(job, self.CFG, 5 * GIB, pred)
        self.assertIsNone(n)
        self.assertIn("even 2 layers", why)

    def test_fixed_job_is_skipped_when_it_does_not_fit(self):
        job = h.grid("full")[0]
        n, why = h.choose_layers(job, {"num_hidden_layers": 32}, 10 * GIB, lambda n: 20 * GIB)
        self.assertIsNone(n)
        self.assertIn("predicted 20.0 GiB > 10.0 GiB free", why)

    def test_no_moro_or_no_nvml(self):
        job = h.grid("full")[2]
        self.assertEqual(h.choose_layers(job, self.CFG, None, lambda n: 1), (None, ""))
        self.assertEqual(h.choose_layers(job, self.CFG, 9 * GIB, lambda n: None), (None, ""))
        pinned = dataclasses.replace(job, layers=4)
        self.assertEqual(h.choose_layers(pinned, self.CFG, None, lambda n: 1), (4, ""))

    def test_predict_with_a_fake_moro(self):
        job = h.grid("full")[0]
        seen = {}

        def runner(cmd, **kw):
            seen["cmd"] = cmd
            with open(cmd[cmd.index("--model") + 1]) as f:
                seen["layers"] = json.load(f)["num_hidden_layers"]
            return types.SimpleNamespace(returncode=0, stdout='{"peak_device_bytes": 123}')

        with tempfile.TemporaryDirectory() as d:
            p = h.predict_device_bytes("moro", job, {"num_hidden_layers": 32}, 7, d, runner)
        self.assertEqual(p, 123)
        self.assertEqual(seen["layers"], 7)
        cmd = seen["cmd"]
        self.assertEqual(cmd[:3], ["moro", "estimate", "--json"])
        for flag in ("--quantization", "nf4-dq", "--optimizer", "adamw_torch_fused",
                     "--gradient-checkpointing=true", "--lora-rank", "16"):
            self.assertIn(flag, cmd)
        self.assertIsNone(h.predict_device_bytes(None, job, {}, 7, "/nonexistent"))

    def test_smi_parsers(self):
        self.assertEqual(h.parse_smi_memory("1024, 81920\n"), (1024 * MIB, 81920 * MIB))
        self.assertIsNone(h.parse_smi_memory("[N/A], [N/A]"))
        self.assertEqual(h.parse_smi_process("12, 500\n34, 700\n", 34), 700 * MIB)
        self.assertIsNone(h.parse_smi_process("12, 500\n", 34))
        self.assertEqual(h.parse_smi_uuid_used("GPU-a, 10\nGPU-b, 20\nbad\n"),
                         {"GPU-a": 10 * MIB, "GPU-b": 20 * MIB})


def fake_torch(cuda_build="12.4", available=True):
    """A stand-in for torch with the CUDA calls the worker makes."""
    torch = types.ModuleType("torch")
    torch.version = types.SimpleNamespace(cuda=cuda_build)

    class OutOfMemoryError(RuntimeError):
        pass

    stats = {"requested_bytes.all.peak": 5 * GIB, "num_alloc_retries": 2}
    torch.cuda = types.SimpleNamespace(
        OutOfMemoryError=OutOfMemoryError,
        is_available=lambda: available,
        init=lambda: None,
        mem_get_info=lambda: (100 * GIB, 140 * GIB),
        set_per_process_memory_fraction=lambda f: torch.fractions.append(f),
        synchronize=lambda: None,
        max_memory_allocated=lambda: 6 * GIB,
        max_memory_reserved=lambda: 7 * GIB,
        memory_reserved=lambda: 7 * GIB,
        memory_stats=lambda: stats,
        empty_cache=lambda: None,
        reset_peak_memory_stats=lambda: None,
    )
    torch.fractions = []
    torch.ones = lambda *a, **k: None
    return torch


class PeakTraceTest(unittest.TestCase):
    """`peak_trace` on a hand-made allocator trace."""

    def test_live_set_at_the_peak(self):
        hf = {"filename": "/x/transformers/models/llama/modeling_llama.py", "line": 10,
              "name": "forward"}
        loss = {"filename": "/x/transformers/loss/loss_utils.py", "line": 30, "name": "loss"}
        inner = {"filename": "/x/torch/nn/functional.py", "line": 1, "name": "linear"}
        ev = [
            {"action": "segment_alloc", "addr": 0, "size": 40 * MIB},
            {"action": "alloc", "addr": 1, "size": 8 * MIB, "frames": [inner, hf]},
            {"action": "alloc", "addr": 2, "size": 8 * MIB, "frames": [inner, hf]},
            {"action": "alloc", "addr": 3, "size": 20 * MIB, "frames": [loss]},
            {"action": "free_requested", "addr": 1, "size": 8 * MIB},
            {"action": "free_completed", "addr": 1, "size": 8 * MIB},
            {"action": "segment_alloc", "addr": 9, "size": 30 * MIB},
            {"action": "alloc", "addr": 4, "size": 30 * MIB, "frames": []},
            {"action": "free_completed", "addr": 4, "size": 30 * MIB},
            {"action": "free_completed", "addr": 3, "size": 20 * MIB},
        ]
        # 100 MiB allocated and 120 MiB reserved before recording began.
        t = h.peak_trace(ev, 100 * MIB, 120 * MIB)
        # Peak after addr 4: 100 + 8 + 20 + 30 = 158 MiB (addr 1 was freed).
        self.assertEqual(t["allocated_peak_bytes"], 158 * MIB)
        self.assertEqual(t["peak_event"], 7)
        self.assertEqual(t["untracked_bytes"], 100 * MIB)
        self.assertEqual(t["live_top"][0], {"site": "?", "bytes_each": 30 * MIB, "count": 1,
                                            "bytes": 30 * MIB})
        self.assertEqual(t["live_top"][1]["site"], "loss_utils.py:30:loss")
        self.assertEqual(t["live_top"][2], {"site": "modeling_llama.py:10:forward",
                                            "bytes_each": 8 * MIB, "count": 1,
                                            "bytes": 8 * MIB})
        self.assertEqual(t["reserved_peak_bytes"], 190 * MIB)
        self.assertEqual(t["allocated_at_reserved_peak_bytes"], 128 * MIB)

    def test_untied_model_is_recorded(self):
        job = h.grid("full")[0]
        r = {"outcome": "ok", "allocated_bytes": GIB, "reserved_bytes": GIB, "layers": 32,
             "layers_full": 32, "steps": 3, "config_tied": True,
             "checks": {"tied_embeddings": False}}
        self.assertEqual(h.build_rows(job, r, MACHINE)[0]["model_overrides"],
                         {"tie_word_embeddings": False})
        r["checks"]["tied_embeddings"] = True
        self.assertNotIn("model_overrides", h.build_rows(job, r, MACHINE)[0])

    def test_a_real_trace_replays_through_allocsim(self):
        trace = [
            {"action": "segment_alloc", "addr": 0, "size": 100 * MIB},
            {"action": "alloc", "addr": 0, "size": 100 * MIB},
            {"action": "free_requested", "addr": 0, "size": 100 * MIB},
            {"action": "free_completed", "addr": 0, "size": 100 * MIB},
            {"action": "alloc", "addr": 0, "size": 30 * MIB},
            {"action": "segment_alloc", "addr": 1 << 40, "size": 100 * MIB},
            {"action": "alloc", "addr": 1 << 40, "size": 100 * MIB},
        ]
        self.assertEqual(h.allocation_events(trace),
                         [["a", 0, 100 * MIB], ["f", 0], ["a", 0, 30 * MIB],
                          ["a", 1 << 40, 100 * MIB]])
        # The model splits the cached 100 MiB block for 30 MiB and needs a second segment,
        # as the trace's own segment_alloc says; on top of 1 GiB already there.
        self.assertEqual(h.replayed_peaks(trace, GIB, GIB),
                         {"replayed_allocated_peak_bytes": GIB + 130 * MIB,
                          "replayed_reserved_peak_bytes": GIB + 200 * MIB})
        self.assertEqual(h.peak_trace(trace, GIB, GIB)["reserved_peak_bytes"], GIB + 200 * MIB)

    def test_recording_calls_the_allocator_and_writes_the_trace(self):
        calls = []
        trace = [{"action": "segment_alloc", "addr": 0, "size": 20 * MIB},
                 {"action": "alloc", "addr": 0, "size": 4 * MIB, "frames": []},
                 {"action": "free_completed", "addr": 0, "size": 4 * MIB}]
        memory = types.SimpleNamespace(
            _record_memory_history=lambda *a, **k: calls.append(k),
            _snapshot=lambda: {"device_traces": [[], trace]})
        torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
            memory=memory, memory_allocated=lambda: GIB, memory_reserved=lambda: 2 * GIB,
            current_device=lambda: 1))
        start = h.start_recording(torch)
        self.assertEqual(start, (GIB, 2 * GIB))
        self.assertEqual(calls, [{"max_entries": 2_000_000, "stacks": "python"}])
        job = h.grid("full")[0]
        with tempfile.TemporaryDirectory() as d:
            t = h.finish_recording(torch, start, job, os.path.join(d, "traces"))
            self.assertEqual(calls[-1], {"enabled": None})
            self.assertEqual(t["allocated_peak_bytes"], GIB + 4 * MIB)
            self.assertEqual(t["reserved_peak_bytes"], 2 * GIB + 20 * MIB)
            self.assertEqual(t["replayed_reserved_peak_bytes"], 2 * GIB + 20 * MIB)
            with open(os.path.join(d, "traces", job.short_id() + ".json")) as f:
                self.assertEqual(json.load(f), [["a", 0, 4 * MIB], ["f", 0]])

    def test_trace_goes_into_the_row(self):
        job = h.grid("full")[0]
        r = {"outcome": "ok", "allocated_bytes": GIB, "reserved_bytes": GIB, "layers": 32,
             "layers_full": 32, "steps": 3, "peak_trace": {"allocated_peak_bytes": GIB}}
        rows = h.build_rows(job, r, MACHINE)
        self.assertEqual(rows[0]["calibration"]["peak_trace"], {"allocated_peak_bytes": GIB})
        del r["peak_trace"]
        self.assertNotIn("peak_trace", h.build_rows(job, r, MACHINE)[0]["calibration"])


class WorkerWithFakeTorchTest(unittest.TestCase):
    """The worker's CUDA bookkeeping with torch mocked (the model code needs real torch)."""

    def setUp(self):
        self.saved = sys.modules.get("torch")

    def tearDown(self):
        if self.saved is None:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = self.saved

    def spec(self, job):
        return {"job": job.to_dict(), "layers": 8, "configs": os.path.join(ROOT, "data", "models"),
                "margin_bytes": 2 * GIB, "steps": 3, "uuid": None}

    def test_oom_is_caught_and_measured(self):
        torch = sys.modules["torch"] = fake_torch()
        job = h.grid("full")[0]

        def oom(*a, **k):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")

        with unittest.mock.patch.object(h, "build_model", oom), \
                unittest.mock.patch.object(h.Smi, "__init__", _no_smi):
            r = h.worker_job(self.spec(job))
        self.assertEqual(r["outcome"], "OOM")
        self.assertEqual(r["error"], "CUDA out of memory. Tried to allocate 2.00 GiB")
        self.assertEqual((r["allocated_bytes"], r["reserved_bytes"]), (6 * GIB, 7 * GIB))
        self.assertEqual((r["layers"], r["layers_full"]), (8, 32))
        # The limit: free memory minus the margin, as a fraction of the card.
        self.assertAlmostEqual(torch.fractions[0], 98 / 140)
        self.assertEqual(r["memory_limit_bytes"], int(98 / 140 * 140 * GIB))
        rows = h.build_rows(job, r, MACHINE)
        self.assertEqual([x["outcome"] for x in rows], ["OOM"])

    def test_other_errors_are_not_rows(self):
        sys.modules["torch"] = fake_torch()
        job = h.grid("full")[0]

        def boom(*a, **k):
            raise KeyError("rope_scaling")

        with unittest.mock.patch.object(h, "build_model", boom), \
                unittest.mock.patch.object(h.Smi, "__init__", _no_smi):
            r = h.worker_job(self.spec(job))
        self.assertEqual(r["outcome"], "error")
        self.assertIn("KeyError", r["error"])

    def test_probe_says_what_is_missing(self):
        sys.modules["torch"] = fake_torch(cuda_build=None)
        self.assertEqual(h.worker_probe()["error"], "torch has no CUDA (CPU-only build)")
        sys.modules["torch"] = fake_torch(available=False)
        with unittest.mock.patch.object(h.Smi, "__init__", _no_smi):
            self.assertEqual(h.worker_probe()["error"], "no NVIDIA GPU visible")


def _no_smi(self, device=None, runner=None):
    """Smi without pynvml or nvidia-smi (what a machine without the driver tools has)."""
    self.device, self.runner, self.nvml, self.handle = device, lambda *a, **k: None, None, None


if __name__ == "__main__":
    unittest.main()
