// moro serve's page: the form is the state (mirrored in the URL); every number comes from
// the JSON API, which runs the CLI's own commands.
"use strict";

const $ = (id) => document.getElementById(id);
const FIELDS = ["model", "method", "seq_len", "hardware", "micro_batch_size", "grad_accum",
  "optimizer", "gradient_checkpointing", "attention", "precision", "lora_rank", "target_len",
  "max_new_tokens", "stack", "liger", "compile", "activation_offload", "dataset"];
const SWITCHES = new Set(["gradient_checkpointing", "liger", "compile", "activation_offload"]);
const NUMBERS = new Set(["seq_len", "micro_batch_size", "grad_accum", "lora_rank", "target_len",
  "max_new_tokens"]);
const SIZE = /^\s*\d+(\.\d+)?\s*[bBmM]\s*$/;
const GIB = 1024 ** 3;
const gib = (b) => (b / GIB).toFixed(2);
const seq = {};
const lastNotes = {}; // what each route's command printed on stderr, last time
const SHOWN = 8; // fit rows shown before "show all"

function values() {
  const v = {};
  for (const f of FIELDS) {
    const raw = $(f).value.trim();
    if (raw === "") continue;
    if (NUMBERS.has(f)) v[f] = Number(raw);
    else if (SWITCHES.has(f)) v[f] = raw === "true";
    else v[f] = raw;
  }
  return v;
}

function saveUrl(v) {
  const q = new URLSearchParams();
  for (const [k, x] of Object.entries(v)) q.set(k, String(x));
  history.replaceState(null, "", "?" + q.toString());
}

function loadUrl() {
  const q = new URLSearchParams(location.search);
  for (const f of FIELDS) if (q.has(f)) $(f).value = q.get(f);
}

async function call(path, body) {
  const r = await fetch(path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  const text = await r.text();
  const notes = r.headers.get("moro-notes");
  if (notes) lastNotes[path] = decodeURIComponent(notes).split("\n");
  else delete lastNotes[path];
  if (!r.ok) {
    let msg = text;
    try { const e = JSON.parse(text).error; msg = e.message + (e.hint ? " — " + e.hint : ""); } catch (_) { /* plain text */ }
    throw new Error(msg);
  }
  return text;
}

// The latest request of each kind wins; an older answer arriving late is dropped.
async function latest(kind, f) {
  const n = (seq[kind] = (seq[kind] || 0) + 1);
  try {
    const out = await f();
    return n === seq[kind] ? out : undefined;
  } catch (e) {
    if (n === seq[kind]) throw e;
    return undefined;
  }
}

function status(el, text, cls) {
  el.textContent = text;
  el.className = "status" + (cls ? " " + cls : "");
}

function fitBody(v) {
  const b = { method: v.method, seq_len: v.seq_len };
  if (SIZE.test(v.model || "")) b.model_size = v.model.replace(/\s/g, ""); else b.model = v.model;
  if (v.stack) b.stack = v.stack;
  return b;
}

let fitModel = null; // the catalog model a size such as "7B" stands for

async function refreshFit(v) {
  const el = $("fit-status");
  status(el, "searching every GPU class…");
  try {
    const body = fitBody(v);
    const got = await latest("fit", async () => [await call("/api/fit", body), await call("/api/fit.svg", body)]);
    if (!got) return;
    const doc = JSON.parse(got[0]);
    fitModel = doc.model;
    const tbody = $("fit-table").querySelector("tbody");
    tbody.replaceChildren();
    const more = $("fit-all");
    more.hidden = doc.fits.length <= SHOWN;
    more.textContent = `show all ${doc.fits.length} GPU classes`;
    const not = $("fit-not");
    not.hidden = true;
    not.textContent = doc.does_not_fit.length ? `Does not fit on 64 GPUs of: ${doc.does_not_fit.join(", ")}.` : "";
    doc.fits.forEach((r, i) => {
      const tr = document.createElement("tr");
      const hw = r.gpus > 1 ? `${r.gpus}x${r.preset}` : r.preset;
      const cells = [r.name, String(r.gpus), r.strategy, gib(r.peak_device_bytes), gib(r.peak_upper_bytes),
        r.total_usd_per_hour == null ? "–" : r.total_usd_per_hour.toFixed(2)];
      cells.forEach((c, i) => {
        const td = document.createElement("td");
        td.textContent = c;
        if (i === 1 || i >= 3) td.className = "num";
        tr.appendChild(td);
      });
      const td = document.createElement("td");
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = "moro.yaml";
      b.dataset.hardware = hw;
      b.addEventListener("click", () => recipe(hw, true));
      td.appendChild(b);
      tr.appendChild(td);
      tr.hidden = i >= SHOWN;
      tbody.appendChild(tr);
    });
    $("fit-chart").innerHTML = got[1];
    const model = doc.model + (doc.model !== v.model ? ` (for ${v.model})` : "");
    status(el, doc.fits.length
      ? `${model}: ${doc.fits.length} GPU classes run it, cheapest first; ${doc.does_not_fit.length} do not even as 64.`
      : `${model}: no GPU class runs it, not even 64 GPUs; try QLoRA or a shorter context.`,
    doc.fits.length ? "fits" : "bad");
  } catch (e) {
    $("fit-table").querySelector("tbody").replaceChildren();
    $("fit-chart").replaceChildren();
    status(el, e.message, "bad");
  }
}

function estimateBody(v) {
  const b = { ...v };
  if (SIZE.test(b.model || "")) b.model = fitModel || b.model;
  if (b.dataset) delete b.seq_len;
  return b;
}

async function refreshEstimate(v) {
  const el = $("verdict");
  status(el, "estimating…");
  try {
    const body = estimateBody(v);
    const got = await latest("estimate", async () => [await call("/api/estimate", body), await call("/api/estimate.svg", body)]);
    if (!got) return;
    const d = JSON.parse(got[0]);
    $("out-allocated").textContent = gib(d.peak_allocated_bytes);
    $("out-reserved").textContent = gib(d.peak_reserved_bytes);
    $("out-device").textContent = gib(d.peak_device_bytes);
    $("out-allocated-max").textContent = gib(d.upper.allocated);
    $("out-reserved-max").textContent = gib(d.upper.reserved);
    $("out-device-max").textContent = gib(d.upper.device);
    // PyTorch on an Apple GPU: the MPS allocator's counters (torch.mps has no peaks).
    const mps = d.backend === "mps";
    $("out-allocated-by").textContent = mps ? "torch.accelerator.max_memory_allocated()" : "torch.cuda.max_memory_allocated()";
    $("out-reserved-by").textContent = mps ? "torch.accelerator.max_memory_reserved()" : "max_memory_reserved()";
    $("out-device-by").textContent = mps ? "torch.mps.driver_allocated_memory()" : "nvidia-smi";
    $("estimate-chart").innerHTML = got[1];
    const notes = (lastNotes["/api/estimate"] || []).slice();
    // A generation's outgrown cache blocks: kept while the GPU has room, returned when short.
    if (d.idle_cache_bytes) {
      notes.push(`generating, the keys and values leave ${gib(d.idle_cache_bytes)} GiB of old blocks that PyTorch keeps cached while the GPU has room (max_memory_reserved and nvidia-smi count them) and returns when memory runs short`);
    }
    $("notes").textContent = notes.join("\n");
    if (d.memory_bytes == null) {
      status(el, `peak ${gib(d.peak_device_bytes)} GiB at ${d.peak_phase}; choose a GPU to see whether it fits.`);
    } else if (d.verdict === "fits") {
      status(el, `fits: ${gib(d.headroom_bytes)} GiB spare of ${gib(d.memory_bytes)} GiB (at most ${gib(d.upper.device)} GiB).`, "fits");
    } else if (d.verdict === "uncertain") {
      status(el, `uncertain: the prediction fits, its bound (${gib(d.upper.device)} GiB) does not.`, "bad");
    } else {
      status(el, `does not fit: ${gib(-d.headroom_bytes)} GiB over ${gib(d.memory_bytes)} GiB.`, "bad");
    }
  } catch (e) {
    for (const id of ["out-allocated", "out-reserved", "out-device"]) $(id).textContent = "–";
    $("notes").textContent = "";
    $("estimate-chart").replaceChildren();
    status(el, e.message, "bad");
  }
}

function recipeBody(hardware) {
  const v = values();
  const b = { model: estimateBody(v).model, hardware, method: v.method === "inference" ? "auto" : v.method,
    objective: $("objective").value };
  if (v.dataset) b.dataset = v.dataset; else if (v.seq_len) b.seq_len = v.seq_len;
  if (v.stack) b.stack = v.stack;
  if (v.target_len) b.target_len = v.target_len;
  return b;
}

function download(name, text) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(new Blob([text], { type: "text/plain" }));
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
}

function chosenHardware() {
  const hw = $("hardware").value;
  if (hw) return hw;
  const first = $("fit-table").querySelector("button");
  return first ? first.dataset.hardware : "detect";
}

async function recipe(hardware, save) {
  const el = $("recipe-status");
  status(el, "searching…");
  try {
    const yaml = await call("/api/recipe.yaml", recipeBody(hardware));
    $("recipe-text").textContent = yaml;
    status(el, `the recipe for ${hardware}`, "fits");
    if (save) download("moro.yaml", yaml);
    return yaml;
  } catch (e) {
    status(el, e.message, "bad");
    return null;
  }
}

async function exportTo() {
  const yaml = await recipe(chosenHardware(), false);
  if (!yaml) return;
  const to = $("export-to").value;
  try {
    const r = JSON.parse(await call("/api/export", { recipe: yaml, to }));
    $("recipe-text").textContent = r.files.map((f) => `# ${f.name}\n${f.content}`).join("\n");
    for (const f of r.files) download(f.name, f.content);
    status($("recipe-status"), `${to}: ${r.files.map((f) => f.name).join(", ")} · launch: ${r.launch}`, "fits");
  } catch (e) {
    status($("recipe-status"), e.message, "bad");
  }
}

let timer = null;
let lastFit = "";
let changes = 0;
function changed() {
  clearTimeout(timer);
  timer = setTimeout(async () => {
    const mine = ++changes;
    const v = values();
    saveUrl(v);
    const fitKey = JSON.stringify(fitBody(v));
    const jobs = [];
    if (fitKey !== lastFit) { lastFit = fitKey; jobs.push(refreshFit(v)); }
    await Promise.all(jobs);
    await refreshEstimate(v);
    if (mine !== changes) return; // a later change is on its way
    // For tests and scripts: which settings the numbers on the page are for.
    document.body.dataset.shown = new URLSearchParams(Object.entries(v).map(([k, x]) => [k, String(x)])).toString();
    document.body.dataset.ready = String(Number(document.body.dataset.ready || 0) + 1);
  }, 200);
}

async function init() {
  const [models, hw] = await Promise.all([
    fetch("/api/models").then((r) => r.json()).catch(() => []),
    fetch("/api/hardware").then((r) => r.json()).catch(() => ({ detected: [], presets: [] })),
  ]);
  const list = $("models");
  for (const m of models) {
    const o = document.createElement("option");
    o.value = m.id;
    o.label = `${(m.parameters / 1e9).toFixed(1)}B ${m.model_type}`;
    list.appendChild(o);
  }
  const sel = $("hardware");
  const add = (value, label) => { const o = document.createElement("option"); o.value = value; o.textContent = label; sel.appendChild(o); };
  add("", "no GPU chosen");
  for (const d of hw.detected || []) add("detect", `this machine: ${d.name} (${gib(d.total_bytes || d.memory_bytes || 0)} GiB)`);
  for (const p of hw.presets) add(p.preset, `${p.name} (${gib(p.memory_bytes)} GiB)`);
  loadUrl();
  $("job").addEventListener("input", changed);
  $("job").addEventListener("change", changed);
  $("job").addEventListener("submit", (e) => e.preventDefault());
  $("fit-all").addEventListener("click", () => {
    for (const tr of $("fit-table").querySelectorAll("tbody tr")) tr.hidden = false;
    $("fit-all").hidden = true;
    $("fit-not").hidden = $("fit-not").textContent === "";
  });
  $("get-recipe").addEventListener("click", () => recipe(chosenHardware(), true));
  $("get-export").addEventListener("click", exportTo);
  changed();
}

init();
