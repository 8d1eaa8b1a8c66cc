#!/usr/bin/env python
"""Fake-tensor trace of one training step of a transformers 5 vision-language model (VLM).

The fake-CUDA oracle (../shared/oracle: oracle.py, fakecuda.py, tracker.py; `MORO_ORACLE_DIR`
overrides) builds models with `AutoModelForCausalLM` and feeds only `input_ids`. This wrapper
reuses its machinery unchanged (the `_hasPrimaryContext` backward patch, the CUDA query stubs, the
`swap_tensors` fallback, `GpuLikeSDPA`, the packed-sequence shortcut, `LiveStorageTracker` and the
optimizer-state tagger) and only replaces the driver: the model is built with
`AutoModelForImageTextToText.from_config` and fed what the model's processor produces (input_ids
with the image placeholder block, attention_mask, labels, pixel_values, image_grid_thw for Qwen,
mm_token_type_ids / token_type_ids), all moved to the (fake) GPU as HF Trainer does (pixel_values
stay fp32, as the processors emit them).

Where the image tokens come from (transformers 5.24.0, site-packages/transformers/models/...):
  * Qwen2-VL / Qwen2.5-VL: `qwen2_vl/image_processing_pil_qwen2_vl.py:smart_resize` (resize to a
    multiple of patch*merge = 28 with min_pixels <= h*w <= max_pixels) and
    `Qwen2VLImageProcessorPil._preprocess` (image_grid_thw = [1, h/14, w/14]); the text rule is
    `qwen2_vl/processing_qwen2_vl.py:Qwen2VLProcessor.replace_image_token` (and the identical
    `qwen2_5_vl/processing_qwen2_5_vl.py:Qwen2_5_VLProcessor.replace_image_token`):
    grid_thw.prod() // merge_size**2 copies of <|image_pad|>. The chat template wraps each image
    in <|vision_start|> ... <|vision_end|> (2 boundary tokens).
  * Gemma 3: `gemma3/processing_gemma3.py:Gemma3Processor.__init__` builds
    full_image_sequence = "\\n\\n" + <start_of_image> + 256 x <image_soft_token> + <end_of_image>
    + "\\n\\n" and it replaces the prompt's <start_of_image>; `image_seq_length` = 256 fixed,
    pan-and-scan off (`images_kwargs["do_pan_and_scan"] = False`). The image is resized to the
    tower's 896x896 by `gemma3/image_processing_pil_gemma3.py:Gemma3ImageProcessorPil`.
  * LLaVA-1.5: `llava/processing_llava.py:LlavaProcessor.replace_image_token`:
    (h // patch) * (w // patch) + num_additional_image_tokens (1, the CLS), minus 1 for
    vision_feature_select_strategy "default" = 576 at 336x336
    (`clip/image_processing_pil_clip.py:CLIPImageProcessorPil`: shortest edge 336, center crop).
  * Idefics3: `idefics3/image_processing_pil_idefics3.py:Idefics3ImageProcessorPil._preprocess`
    (resize longest edge to 4*364, split into 364x364 tiles + one global image) and
    `idefics3/processing_idefics3.py:Idefics3Processor.replace_image_token`
    ((rows*cols + 1) * image_seq_len placeholders, plus <fake_token_around_image>,
    <row_i_col_j>, <global-img> and newline characters).
  * Llama 3.2 Vision: `mllama/image_processing_pil_mllama.py` (tiles of 560 x 560, padded to
    `max_image_tiles` = 4 empty ones included) and `mllama/processing_mllama.py` (the prompt's
    <|image|> token stays; `get_cross_attention_token_mask` and
    `convert_sparse_cross_attention_mask_to_dense` make the cross_attention_mask).
    `--matrix mllama` regenerates validation/oracle-traces/vlm-mllama.jsonl (8 cases, about
    2 minutes) from validation/vlm-configs/.
  Class defaults differ from the models' published preprocessor_config.json for three of them
  (Gemma3ImageProcessor: 224x224; CLIPImageProcessor: 224; Qwen2VLImageProcessor:
  max_pixels 28*28*1280 = 1003520 while Qwen's preprocessor_config.json has 12845056). The trace
  uses the published values (`PROFILES["hub"]`); `--matrix image-tokens` records both.

Data-dependent code on fake tensors (what had to be answered, and how):
  * Qwen's vision helpers (`transformers/vision_utils.py`: get_vision_attention_seqlens,
    get_vision_position_ids, get_vision_window_index) and `get_rope_index` read grid_thw /
    input_ids values (`.tolist()`). They run here on the real host copies of the inputs (the
    values are known: this script made them), and their outputs come back as fake tensors of the
    same shape on the device a GPU run puts them on; cu_seqlens (whose values the SDPA path reads
    for `torch.split`) come back as host constants. image_grid_thw itself is a host constant
    (24 B per image; on a GPU it is a 512-B block).
  * `torch_compilable_check` (placeholder count == feature count) cannot read a fake bool:
    TRANSFORMERS_DISABLE_TORCH_CHECK=1 (a supported HF switch; the counts match by construction).
  * The attention_mask is all ones (no padding): HF's `_ignore_causal_mask_sdpa` /
    `_ignore_bidirectional_mask_sdpa` cannot read a fake mask and would build a 4-D mask a GPU run
    skips, so they are answered as for "no padding" (the oracle's own premise). Where the model
    needs a mask anyway (Gemma 3's bidirectional image blocks), the mask is built as on a GPU.

`--matrix vlm` regenerates validation/oracle-traces/vlm.jsonl (every model, every case, cut to
4 text and 8 vision layers; about 6 minutes on two cores; the `params` in each line are the cut
model's, the full models' counts are in validation/vlm-params.json);
`--matrix image-tokens` regenerates validation/vlm-image-tokens.jsonl; `--matrix params`
regenerates validation/vlm-params.json (meta-device parameter counts by component).

Example (PY = the oracle venv's python, from the repository root):
  $PY calibration/vlm_trace.py --config data/models/Qwen--Qwen2.5-VL-3B-Instruct.json \\
      --text-layers 4 --vision-layers 8 --method lora --precision bf16 --batch 1 --seq 512 \\
      --images-per-sample 1 --image-size 896x896
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
ORACLE_DIR = os.environ.get("MORO_ORACLE_DIR") or os.path.normpath(
    os.path.join(ROOT, "..", "shared", "oracle")
)
CONFIG_DIRS = [
    os.path.join(ROOT, "data", "models"),
    os.path.join(ROOT, "validation", "vlm-configs"),
]
TRACES = os.path.join(ROOT, "validation", "oracle-traces", "vlm.jsonl")
IMAGE_TOKENS = os.path.join(ROOT, "validation", "vlm-image-tokens.jsonl")
PARAMS = os.path.join(ROOT, "validation", "vlm-params.json")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TRANSFORMERS_DISABLE_TORCH_CHECK", "1")

LM_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# Published preprocessor settings (preprocessor_config.json / processor_config.json of the
# checkpoints) where they differ from the image processor class defaults.
PROFILES = {
    "hub": {
        "qwen": {"min_pixels": 3136, "max_pixels": 12845056},
        "gemma3": {"size": {"height": 896, "width": 896}},
        "llava": {"size": {"shortest_edge": 336}, "crop_size": {"height": 336, "width": 336}},
        "idefics3": {},
        "pixtral": {},
        # Llama 3.2 Vision's preprocessor_config.json: 560 x 560 tiles, at most 4.
        "mllama": {"size": {"height": 560, "width": 560}, "max_image_tiles": 4},
    },
    "class_default": {"qwen": {}, "gemma3": {}, "llava": {}, "idefics3": {}, "pixtral": {},
                      "mllama": {}},
}


# ----------------------------------------------------------------------------- families
def patch_idefics3_for_fake() -> str:
    """`Idefics3Model.get_image_features` drops all-zero padding images with a boolean index
    and splits the features by `num_real_images_per_batch.tolist()`: shapes that depend on
    data, which fake tensors cannot give. Every image the trace feeds is real, so the same
    method without the filter (source patched, nothing else changed) runs the same ops."""
    import inspect
    import textwrap

    from transformers.models.idefics3 import modeling_idefics3 as m

    src = textwrap.dedent(inspect.getsource(m.Idefics3Model.get_image_features))
    for old, new in [
        ("pixel_values = pixel_values[real_images_inds].contiguous()",
         "pixel_values = pixel_values.contiguous()"),
        ("pixel_attention_mask = pixel_attention_mask[real_images_inds].contiguous()",
         "pixel_attention_mask = pixel_attention_mask.contiguous()"),
        ("image_features.split(num_real_images_per_batch.tolist())",
         "image_features.split([num_images] * batch_size)"),
    ]:
        if old not in src:
            raise RuntimeError("idefics3 patch: %r not found" % old)
        src = src.replace(old, new)
    src = "\n".join(line for line in src.splitlines() if not line.lstrip().startswith("@"))
    ns = dict(vars(m))
    exec(src, ns)
    # `can_return_tuple` takes `return_dict`, as on the original (its docstring decorator only
    # documents).
    m.Idefics3Model.get_image_features = m.can_return_tuple(ns["get_image_features"])
    return "idefics3: get_image_features without the padding-image filter (every image is real)"


def patch_mistral3_for_fake() -> str:
    """`Mistral3Model.get_image_features` splits the features by sizes it computes on the
    device and reads back (`.tolist()`); the same sizes from the host list of image sizes
    (source patched, nothing else changed)."""
    import inspect
    import textwrap

    from transformers.models.mistral3 import modeling_mistral3 as m

    src = textwrap.dedent(inspect.getsource(m.Mistral3Model.get_image_features))
    old = ("(torch.as_tensor(image_sizes, device=image_features.device) // downsample_ratio)"
           ".prod(dim=-1).tolist()")
    if old not in src:
        raise RuntimeError("mistral3 patch: the split sizes line was not found")
    src = src.replace(old, "[(h // downsample_ratio) * (w // downsample_ratio) for h, w in image_sizes]")
    src = src[src.index("def get_image_features"):]  # the decorators, some over several lines
    ns = dict(vars(m))
    exec(src, ns)
    # The original's decorators but the docstring one.
    fn = m.select_hidden_states("vision_feature_layer")(ns["get_image_features"])
    m.Mistral3Model.get_image_features = m.can_return_tuple(fn)
    return "mistral3: get_image_features splits by host-computed sizes"


def family_of(model_type: str) -> str:
    return {"qwen2_vl": "qwen", "qwen2_5_vl": "qwen", "qwen3_vl": "qwen", "qwen3_vl_moe": "qwen",
            "gemma3": "gemma3", "llava": "llava", "idefics3": "idefics3",
            "smolvlm": "idefics3", "mistral3": "pixtral", "mllama": "mllama"}[model_type]


def vision_prefixes(family: str):
    """(vision tower prefix, projector prefix) in transformers 5 module names."""
    return {
        "qwen": ("model.visual.", "model.visual.merger."),
        "gemma3": ("model.vision_tower.", "model.multi_modal_projector."),
        "llava": ("model.vision_tower.", "model.multi_modal_projector."),
        "idefics3": ("model.vision_model.", "model.connector."),
        "pixtral": ("model.vision_tower.", "model.multi_modal_projector."),
        "mllama": ("model.vision_model.", "model.multi_modal_projector."),
    }[family]


# ------------------------------------------------------------------------ image inputs
def image_processor(family: str, cfg, profile: str = "hub"):
    """The model's real image processor class (PIL backend: torchvision is not installed; the
    torchvision classes share the same resize/token arithmetic), default arguments plus the
    published preprocessor settings of `profile`."""
    kw = dict(PROFILES[profile][family])
    if family == "qwen":
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil as C
        vc = cfg.vision_config
        kw.update(patch_size=vc.patch_size, temporal_patch_size=vc.temporal_patch_size,
                  merge_size=vc.spatial_merge_size)
        if profile == "hub" and cfg.model_type.startswith("qwen3_vl"):
            # Every Qwen3-VL checkpoint's preprocessor_config.json: 256² to 4096² pixels.
            kw.pop("min_pixels", None)
            kw.pop("max_pixels", None)
            kw["size"] = {"shortest_edge": 65536, "longest_edge": 16777216}
    elif family == "gemma3":
        from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil as C
        if profile == "hub":
            s = cfg.vision_config.image_size
            kw["size"] = {"height": s, "width": s}
    elif family == "llava":
        from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil as C
        if profile == "hub":
            s = cfg.vision_config.image_size
            kw = {"size": {"shortest_edge": s}, "crop_size": {"height": s, "width": s}}
    elif family == "pixtral":
        from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil as C
        # The processor's cells are patch · spatial_merge_size (`PixtralProcessor`); the
        # released preprocessor_config.json's longest edge is the tower's image_size (1540).
        kw.update(patch_size=cfg.vision_config.patch_size * cfg.spatial_merge_size)
        if profile == "hub":
            kw["size"] = {"longest_edge": cfg.vision_config.image_size}
    elif family == "mllama":
        from transformers.models.mllama.image_processing_pil_mllama import MllamaImageProcessorPil as C
    else:
        from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil as C
        if profile == "hub":
            # The released preprocessor_config.json files tile at the tower's image_size and
            # resize to a longest edge of four tiles (Idefics3-8B 364 / 1456, SmolVLM 384 /
            # 1536 and 512 / 2048).
            s = cfg.vision_config.image_size
            kw.update(max_image_size={"longest_edge": s}, size={"longest_edge": 4 * s})
    return C(**kw)


def image_tokens_for(family: str, cfg, width: int, height: int, profile: str = "hub",
                     with_pixels: bool = True) -> dict:
    """Run the real image processor on a black width x height RGB image and apply the
    processor's text expansion rule. Returns the placeholder count the LM sees, the boundary
    tokens, the resized size, the grid and (with_pixels) the pixel_values array."""
    from PIL import Image

    proc = image_processor(family, cfg, profile)
    img = Image.new("RGB", (width, height))
    extra_kw = {"return_row_col_info": True} if family == "idefics3" else {}
    out = proc(img, return_tensors="np", **extra_kw)
    pv = out["pixel_values"]
    res = {"processor_class": type(proc).__name__, "width": width, "height": height}
    if family == "qwen":
        t, gh, gw = (int(x) for x in out["image_grid_thw"][0])
        merge = proc.merge_size
        res.update(image_tokens=t * gh * gw // merge ** 2, extra_tokens=2,
                   extra_tokens_what="<|vision_start|>, <|vision_end|> (chat template)",
                   resized_width=gw * proc.patch_size, resized_height=gh * proc.patch_size,
                   grid={"t": t, "h": gh, "w": gw, "patches": t * gh * gw,
                         "merged_tokens": t * gh * gw // merge ** 2},
                   min_pixels=proc.size["shortest_edge"], max_pixels=proc.size["longest_edge"])
        res["_grid_thw"] = [t, gh, gw]
    elif family == "gemma3":
        n = cfg.mm_tokens_per_image
        _, _, h, w = pv.shape
        p = cfg.vision_config.patch_size
        res.update(image_tokens=n, extra_tokens=4,
                   extra_tokens_what="\\n\\n, <start_of_image>, <end_of_image>, \\n\\n "
                                     "(full_image_sequence; replaces the prompt's <start_of_image>)",
                   resized_width=w, resized_height=h,
                   grid={"patches": (h // p) * (w // p), "pool": "avg %dx%d -> %d tokens" % (
                       (h // p) // int(math.isqrt(n)), (w // p) // int(math.isqrt(n)), n)},
                   pan_and_scan=False)
    elif family == "llava":
        _, _, h, w = pv.shape
        p = cfg.vision_config.patch_size
        n = (h // p) * (w // p) + 1  # num_additional_image_tokens = 1 (CLS)
        if cfg.vision_feature_select_strategy == "default":
            n -= 1
        res.update(image_tokens=n, extra_tokens=0, extra_tokens_what="none (<image> is replaced)",
                   resized_width=w, resized_height=h,
                   grid={"patches": (h // p) * (w // p), "vision_seq": (h // p) * (w // p) + 1})
    elif family == "pixtral":
        _, _, h, w = pv.shape
        cell = cfg.vision_config.patch_size * cfg.spatial_merge_size
        rows, cols = h // cell, w // cell
        # `PixtralProcessor.replace_image_token`: a row of [IMG] then [IMG_BREAK] per row of
        # cells, the last [IMG_BREAK] an [IMG_END].
        res.update(image_tokens=rows * cols, extra_tokens=rows,
                   extra_tokens_what="[IMG_BREAK] after each row, the last an [IMG_END]",
                   resized_width=w, resized_height=h,
                   grid={"rows": rows, "cols": cols, "patches": (h // cfg.vision_config.patch_size)
                         * (w // cfg.vision_config.patch_size)})
        res["_image_size"] = [h, w]
    elif family == "mllama":
        # `MllamaProcessor`: the prompt's one <|image|> token stays; the image reaches the
        # language model through its cross-attention layers, as `pixel_values` of
        # (images, max_image_tiles, 3, tile, tile) tiles, padded with empty ones, over which the
        # tower runs whole.
        tiles = int(out["num_tiles"][0][0])
        res.update(image_tokens=1, extra_tokens=0,
                   extra_tokens_what="none (the <|image|> token itself)",
                   resized_width=None, resized_height=None,
                   grid={"tiles": tiles, "max_image_tiles": proc.max_image_tiles,
                         "pixel_values_shape": list(pv.shape)})
        res["_aspect_ratio_ids"] = out["aspect_ratio_ids"]
        res["_aspect_ratio_mask"] = out["aspect_ratio_mask"]
        res["_num_tiles"] = tiles
    else:
        rows, cols = int(out["rows"][0][0]), int(out["cols"][0][0])
        # `Idefics3Model.image_seq_len`: the tower's patches over the pixel shuffle's
        # scale_factor² (SmolVLM-256M: (512 // 16)² / 4² = 64; Idefics3-8B: 169).
        vc = cfg.vision_config
        seq = int((vc.image_size // vc.patch_size) ** 2 / cfg.scale_factor ** 2)
        tiles = rows * cols + (1 if rows or cols else 0) if (rows or cols) else 1
        n = (rows * cols + 1) * seq if (rows or cols) else seq
        special = rows * cols * 2 + 3 if (rows or cols) else 3
        newlines = rows + 1 if (rows or cols) else 0
        res.update(image_tokens=n, extra_tokens=special, extra_newline_chars=newlines,
                   extra_tokens_what="<fake_token_around_image> + <row_i_col_j> per tile, "
                                     "<fake_token_around_image> <global-img> ... <fake_token_around_image>; "
                                     "plus one \\n per tile row and one before the global image "
                                     "(text; the tokenizer may merge \\n\\n)",
                   resized_width=(cols or 1) * proc.max_image_size["longest_edge"],
                   resized_height=(rows or 1) * proc.max_image_size["longest_edge"],
                   grid={"rows": rows, "cols": cols, "tiles_incl_global": tiles,
                         "tile": proc.max_image_size["longest_edge"], "image_seq_len": seq},
                   pixel_values_shape=list(pv.shape))
    if with_pixels:
        res["_pixel_values"] = pv
    return res


# ------------------------------------------------------------------------ configuration
def load_config(path: str, text_layers: int | None, vision_layers: int | None, attn: str = "sdpa"):
    """HF config object from a config.json, cut to text_layers / vision_layers (Qwen2.5-VL's
    fullatt_block_indexes keep its every-8th-block pattern: the last kept block of each 8)."""
    from transformers import AutoConfig

    with open(path) as f:
        d = json.load(f)
    d = dict(d)
    model_type = d.pop("model_type")
    for k in ("architectures", "transformers_version", "torch_dtype", "dtype", "auto_map",
              "quantization_config", "_name_or_path", "_comment"):
        d.pop(k, None)
    cfg = AutoConfig.for_model(model_type, **d)
    cuts = {}
    text = cfg.get_text_config()
    full_text = text.num_hidden_layers
    if text_layers is not None and text_layers < full_text:
        text.num_hidden_layers = text_layers
        if getattr(text, "layer_types", None):
            text.layer_types = list(text.layer_types)[:text_layers]
        if getattr(text, "max_window_layers", None) is not None:
            text.max_window_layers = min(text.max_window_layers, text_layers)
        cuts["text_layers"] = [text_layers, full_text]
        if getattr(text, "cross_attention_layers", None):
            # Mllama: keep the cross-attention layers inside the cut.
            kept = [i for i in text.cross_attention_layers if i < text_layers]
            cuts["cross_attention_layers"] = [kept, list(text.cross_attention_layers)]
            text.cross_attention_layers = kept
    vc = cfg.vision_config
    vkey = "depth" if hasattr(vc, "depth") else "num_hidden_layers"
    full_vision = getattr(vc, vkey)
    if vision_layers is not None and vision_layers < full_vision:
        setattr(vc, vkey, vision_layers)
        if getattr(vc, "fullatt_block_indexes", None) is not None:
            kept = [i for i in vc.fullatt_block_indexes if i < vision_layers]
            if not kept:
                step = vc.fullatt_block_indexes[0] + 1
                kept = [i for i in range(step - 1, vision_layers, step)] or [vision_layers - 1]
            cuts["fullatt_block_indexes"] = [kept, list(vc.fullatt_block_indexes)]
            vc.fullatt_block_indexes = kept
        cuts["vision_layers"] = [vision_layers, full_vision]
        if getattr(vc, "intermediate_layers_indices", None) is not None:
            # Mllama: the tower's output stacks these layers' outputs beside the last one.
            kept = [i for i in vc.intermediate_layers_indices if i < vision_layers]
            cuts["intermediate_layers_indices"] = [kept, list(vc.intermediate_layers_indices)]
            vc.intermediate_layers_indices = kept
            vc.vision_output_dim = vc.hidden_size * (len(kept) + 1)
    cfg.use_cache = False
    text.use_cache = False
    return cfg, model_type, cuts


def token_ids(cfg, family: str) -> dict:
    if family == "qwen":
        return {"image": cfg.image_token_id, "start": cfg.vision_start_token_id, "end": cfg.vision_end_token_id}
    if family == "gemma3":
        return {"image": cfg.image_token_id, "boi": cfg.boi_token_id, "eoi": cfg.eoi_token_id, "nl2": 108}
    if family == "llava":
        return {"image": cfg.image_token_id}
    if family == "mllama":
        return {"image": cfg.image_token_index}
    return {"image": cfg.image_token_id}


def build_sample(family: str, cfg, text_seq: int, n_images: int, info: dict, rng):
    """One sample's token ids (list) and mm token types: a short text prefix, the image blocks,
    then the rest of the text. Text tokens are random ids below the special-token range."""
    ids = token_ids(cfg, family)
    vocab = cfg.get_text_config().vocab_size
    hi = min(ids.values()) if ids else vocab
    n_img = info["image_tokens"]
    prefix = min(16, text_seq)
    text = rng.integers(0, hi, size=text_seq).tolist()
    seq, types = text[:prefix], [0] * prefix
    for _ in range(n_images):
        if family == "qwen":
            block = [ids["start"]] + [ids["image"]] * n_img + [ids["end"]]
            tt = [0] + [1] * n_img + [0]
        elif family == "gemma3":
            block = [ids["nl2"], ids["boi"]] + [ids["image"]] * n_img + [ids["eoi"], ids["nl2"]]
            tt = [0, 0] + [1] * n_img + [0, 0]
        elif family == "pixtral":
            # The [IMG] cells and, as text ids, the row breaks (the last the end).
            extra = info["extra_tokens"]
            block = [ids["image"]] * n_img + rng.integers(0, hi, size=extra).tolist()
            tt = [1] * n_img + [0] * extra
        elif family == "idefics3":
            # The placeholders and, as text ids, the tiles' <fake_token_around_image> and
            # <row_i_col_j>, the global image's three markers and the newlines: one per
            # row and one before the global image, the last two one "\n\n" token.
            extra = info["extra_tokens"] + max(info.get("extra_newline_chars", 0) - 1, 0)
            block = [ids["image"]] * n_img + rng.integers(0, hi, size=extra).tolist()
            tt = [1] * n_img + [0] * extra
        else:
            block = [ids["image"]] * n_img
            tt = [1] * n_img
        seq += block
        types += tt
    seq += text[prefix:]
    types += [0] * (text_seq - prefix)
    return seq, types


# ----------------------------------------------------------------------------- the shims
class RealValues:
    """Host copies of the inputs this script made, keyed by the fake tensors' ids, and the shims
    that run HF's data-dependent helpers on them."""

    def __init__(self):
        self.real = {}
        self.mode = None

    def remember(self, fake, real):
        import weakref

        self.real[id(fake)] = (weakref.ref(fake), real)  # must not keep the input alive

    def to_real(self, x):
        import torch
        from torch._subclasses.fake_tensor import FakeTensor

        if isinstance(x, FakeTensor):
            if getattr(x, "constant", None) is not None:
                return x.constant
            hit = self.real.get(id(x))
            if hit is None or hit[0]() is not x:
                raise RuntimeError("vlm_trace: a data-dependent helper got a fake tensor whose values "
                                   "are unknown (shape %s)" % (tuple(x.shape),))
            return hit[1]
        if isinstance(x, (list, tuple)):
            return type(x)(self.to_real(e) for e in x)
        if isinstance(x, dict):
            return {k: self.to_real(v) for k, v in x.items()}
        return x

    def host_constant(self, t):
        """A fake host tensor that carries its values (torch.tensor under the fake mode)."""
        import torch

        return torch.tensor(t.tolist(), dtype=t.dtype)

    def device_fake(self, t, device):
        import torch

        return torch.empty(t.shape, dtype=t.dtype, device=device)

    def run_real(self, fn, constant_outputs=(), device="cuda"):
        """Wrap fn: run it on the real values with the fake mode suspended; outputs at the indices
        in constant_outputs come back as host constants, the others as device fakes."""
        import torch
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        shim = self

        def wrapped(*args, **kwargs):
            rargs, rkw = shim.to_real(list(args)), shim.to_real(kwargs)
            # precomputed-kwargs protocol of vision_utils: a popped key must disappear from the
            # caller's dict too (the caller passed its **kwargs dict by reference)
            if "kwargs" in kwargs and isinstance(kwargs["kwargs"], dict):
                rkw["kwargs"] = kwargs["kwargs"]
            with unset_fake_temporarily():
                out = fn(*rargs, **rkw)
            single = not isinstance(out, tuple)
            outs = (out,) if single else out
            res = []
            for i, o in enumerate(outs):
                if isinstance(o, torch.Tensor):
                    o = shim.host_constant(o) if i in constant_outputs else shim.device_fake(o, device)
                res.append(o)
            return res[0] if single else tuple(res)

        wrapped.__wrapped__ = fn
        return wrapped


def install_shims(shim: RealValues) -> list:
    """Patch the data-dependent helpers the VLMs call (see the module docstring)."""
    import torch._subclasses.fake_tensor as ft
    import transformers.masking_utils as mu
    from torch._subclasses.fake_tensor import FakeTensor

    notes = []
    # constants derived from host constants stay constants (cu_seqlens[1:] - cu_seqlens[:-1], ...)
    ft.CONSTANT_NUMEL_LIMIT = 1 << 16
    notes.append("torch FakeTensor CONSTANT_NUMEL_LIMIT raised to 65536 (host-constant index arithmetic)")

    for name in ("_ignore_causal_mask_sdpa", "_ignore_bidirectional_mask_sdpa"):
        orig = getattr(mu, "_vlm_orig_" + name, None) or getattr(mu, name)
        setattr(mu, "_vlm_orig_" + name, orig)

        def make(orig):
            def f(padding_mask, *a, **k):
                if isinstance(padding_mask, FakeTensor):
                    padding_mask = None  # all-ones attention_mask: what a GPU finds
                return orig(padding_mask, *a, **k)
            return f

        setattr(mu, name, make(orig))
    notes.append("masking_utils._ignore_{causal,bidirectional}_mask_sdpa: fake all-ones padding mask treated as no padding")

    # SigLIP's lecun_normal_ init goes through torch.nn.init.trunc_normal_, which reads a value on
    # the host; weights have no values here, so fake tensors skip it (the storage is the same)
    import transformers.initialization as hinit

    orig_tn = getattr(hinit, "_vlm_orig_trunc_normal_", None) or hinit.trunc_normal_
    hinit._vlm_orig_trunc_normal_ = orig_tn

    def trunc_normal_(tensor, *a, **k):
        if isinstance(tensor, FakeTensor):
            return tensor
        return orig_tn(tensor, *a, **k)

    hinit.trunc_normal_ = trunc_normal_
    notes.append("transformers.initialization.trunc_normal_ skipped for fake weights (no values)")

    import transformers.models.qwen2_vl.modeling_qwen2_vl as q2
    import transformers.models.qwen2_5_vl.modeling_qwen2_5_vl as q25
    import transformers.models.qwen3_vl.modeling_qwen3_vl as q3
    import transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe as q3m

    for mod in (q2, q25, q3, q3m):
        for name, const in (("get_vision_attention_seqlens", (0,)), ("get_vision_position_ids", ()),
                            ("get_vision_window_index", (1,)),
                            ("get_vision_interpolation_indices_and_weights", ())):
            if hasattr(mod, name):
                fn = getattr(mod, name)
                fn = getattr(fn, "__wrapped__", fn)
                setattr(mod, name, shim.run_real(fn, constant_outputs=const))
        for cls_name in ("Qwen2VLModel", "Qwen2_5_VLModel", "Qwen3VLModel", "Qwen3VLMoeModel"):
            cls = getattr(mod, cls_name, None)
            if cls is not None and hasattr(cls, "get_rope_index"):
                fn = cls.get_rope_index
                fn = getattr(fn, "__wrapped__", fn)
                cls.get_rope_index = shim.run_real(fn)
    notes.append("qwen vision_utils helpers and get_rope_index run on the host copies of the inputs")

    # Qwen3-VL's DeepStack adds the mergers' outputs at the image positions with a boolean
    # index (`hidden_states[visual_pos_masks, :]`), whose size fake tensors cannot know: the
    # same clone, gather, add and scatter with an index of the image positions' count.
    def deepstack_process(self, hidden_states, visual_pos_masks, visual_embeds):
        import torch

        visual_embeds = visual_embeds.to(hidden_states.device, hidden_states.dtype)
        hidden_states = hidden_states.clone()
        flat = hidden_states.view(-1, hidden_states.shape[-1])
        idx = torch.zeros(visual_embeds.shape[0], dtype=torch.long, device=hidden_states.device)
        local_this = flat.index_select(0, idx) + visual_embeds
        flat.index_copy_(0, idx, local_this)
        return hidden_states

    for mod, cls_name in ((q3, "Qwen3VLTextModel"), (q3m, "Qwen3VLMoeTextModel")):
        cls = getattr(mod, cls_name, None)
        if cls is not None and hasattr(cls, "_deepstack_process"):
            cls._deepstack_process = deepstack_process
    notes.append("qwen3_vl: _deepstack_process with an index of the image positions' count")
    return notes


# ------------------------------------------------------------------------------ params
def param_counts(model, family: str) -> dict:
    vis, proj = vision_prefixes(family)
    out = {"total": 0, "vision_tower": 0, "multi_modal_projector": 0, "language_model": 0,
           "embed_tokens": 0, "lm_head": 0}
    for n, p in model.named_parameters():  # shared (tied) parameters are listed once
        k = p.numel()
        out["total"] += k
        n = n.replace("base_model.model.", "")
        if n.startswith(proj):
            out["multi_modal_projector"] += k
        elif n.startswith(vis):
            out["vision_tower"] += k
        elif n.startswith("lm_head."):
            out["lm_head"] += k
        elif n.endswith("embed_tokens.weight"):
            out["embed_tokens"] += k
        else:
            out["language_model"] += k
    out["language_model_incl_embeddings"] = out["language_model"] + out["embed_tokens"]
    out["tied_lm_head"] = out["lm_head"] == 0
    return out


# -------------------------------------------------------------------------------- trace
def run(args) -> dict:
    t0 = time.time()
    import torch

    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    sys.path.insert(0, ORACLE_DIR)
    import fakecuda
    import oracle
    from torch._subclasses.fake_tensor import FakeTensorMode
    from tracker import LiveStorageTracker
    import numpy as np
    import torch.nn.functional as F

    notes = ["backward patch: " + fakecuda.ensure_fake_cuda_backward()]
    fakecuda.stub_cuda_queries()
    fakecuda.patch_module_apply_for_fake()
    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    notes.extend(oracle.patch_transformers_for_fake())
    shim = RealValues()
    notes.extend(install_shims(shim))
    from transformers import AutoModelForImageTextToText

    cfg, model_type, cuts = load_config(args.config, args.text_layers, args.vision_layers)
    if args.prefill:
        cfg.use_cache = True
        cfg.get_text_config().use_cache = True
    family = family_of(model_type)
    if family == "idefics3":
        notes.append(patch_idefics3_for_fake())
    if family == "pixtral":
        notes.append(patch_mistral3_for_fake())
    W, H = (int(x) for x in args.image_size.lower().split("x"))
    n_img = args.images_per_sample
    info = image_tokens_for(family, cfg, W, H) if n_img else None

    precision, method = args.precision, args.method
    if precision == "fp32":
        base_dtype, autocast = torch.float32, False
    elif precision == "bf16":
        base_dtype, autocast = torch.bfloat16, False
    else:
        base_dtype = torch.float32 if method == "full" else torch.bfloat16
        autocast = True

    sdpa = oracle.GpuLikeSDPA(args.sdpa_backend, emulate_fa_workspace=True)
    F.scaled_dot_product_attention = sdpa
    torch.nn.functional.scaled_dot_product_attention = sdpa

    tracker = LiveStorageTracker("cuda")
    tracker.snapshot_top_at_peak = args.top > 0
    fm = FakeTensorMode(allow_non_fake_inputs=True)
    shim.mode = fm
    vis_prefix, proj_prefix = vision_prefixes(family)

    with fm:
        with torch.device("cuda"):
            attn_impl = args.attn
            if args.vision_attn and args.vision_attn != args.attn:
                attn_impl = {"": args.attn, "text_config": args.attn, "vision_config": args.vision_attn}
            model = AutoModelForImageTextToText.from_config(cfg, dtype=base_dtype, attn_implementation=attn_impl)
        model.train(not args.prefill)
        counts = param_counts(model, family)
        # freeze the vision tower and the projector unless asked (TRL / most VLM recipes)
        for n, p in model.named_parameters():
            in_vision = n.startswith(vis_prefix) or n.startswith(proj_prefix)
            p.requires_grad_(method == "full" and (args.train_vision or not in_vision))
        if args.grad_ckpt:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        lora_targets = None
        if method == "lora":
            from peft import LoraConfig, get_peft_model

            # Idefics3 / SmolVLM name their decoder `model.text_model`, the others
            # `model.language_model`.
            lm_name = "text_model" if family == "idefics3" else "language_model"
            lm = r".*%s\..*\.(%s)$" % (lm_name, "|".join(LM_TARGETS))
            lora_targets = lm
            if args.train_vision:
                vt = {"qwen": "qkv|proj|gate_proj|up_proj|down_proj|mlp\\.0|mlp\\.2",
                      "gemma3": "q_proj|k_proj|v_proj|out_proj|fc1|fc2",
                      "llava": "q_proj|k_proj|v_proj|out_proj|fc1|fc2|linear_1|linear_2",
                      "idefics3": "q_proj|k_proj|v_proj|out_proj|fc1|fc2|proj"}[family]
                lora_targets = r"(%s|(%s|%s).*\.(%s)$)" % (lm, re.escape(vis_prefix), re.escape(proj_prefix), vt)
            lcfg = LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=0.0,
                              target_modules=lora_targets, bias="none", task_type="CAUSAL_LM")
            prev = torch.get_default_dtype()
            torch.set_default_dtype(base_dtype)
            try:
                with torch.device("cuda"):
                    model = get_peft_model(model, lcfg, autocast_adapter_dtype=True)
            finally:
                torch.set_default_dtype(prev)

        # PEFT with gradient checkpointing calls transformers' enable_input_require_grads(), which
        # hooks the input embeddings of every PreTrainedModel inside, the vision tower's patch
        # embedding included: the frozen tower then sits in the autograd graph.
        hooked = sorted(n for n, m in model.named_modules()
                        if any(getattr(h, "__name__", "") == "make_inputs_require_grads"
                               for h in m._forward_hooks.values()))
        params = list(model.parameters())
        trainable = [p for p in params if p.requires_grad]
        n_train = sum(p.numel() for p in {id(p): p for p in trainable}.values())
        n_train_vision = sum(p.numel() for n, p in model.named_parameters()
                             if p.requires_grad and (vis_prefix in n or proj_prefix in n))
        for p in params:
            tracker.register(p, "params_trainable" if p.requires_grad else "params_frozen", "param")
        for b in model.buffers():
            tracker.register(b, "buffers", "buffer")
        for p in trainable:
            p.register_post_accumulate_grad_hook(lambda q: tracker.retag(q.grad, "grads"))
        opt_kwargs = dict(lr=1e-4, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8)
        opt_kwargs["fused" if args.adamw_impl == "fused" else "foreach"] = args.adamw_impl != "for"
        opt = torch.optim.AdamW(trainable, **opt_kwargs)
        tagger = oracle._OptStateTagger(opt, tracker)

        from torch._subclasses.fake_tensor import unset_fake_temporarily

        real_ctx = unset_fake_temporarily()  # the host copies are real tensors
        real_ctx.__enter__()
        rng = np.random.default_rng(0)
        B = args.batch
        rows, types = [], []
        for _ in range(B):
            s, t = build_sample(family, cfg, args.seq, n_img, info, rng) if n_img else (
                rng.integers(0, min(token_ids(cfg, family).values()), size=args.seq).tolist(), [0] * args.seq)
            rows.append(s)
            types.append(t)
        total_seq = len(rows[0])
        real = {
            "input_ids": torch.tensor(rows, dtype=torch.long),
            "attention_mask": torch.ones(B, total_seq, dtype=torch.long),
        }
        labels = real["input_ids"].clone()
        labels[torch.tensor(types) != 0] = -100  # image placeholders are not predicted (TRL collators)
        real["labels"] = labels
        if family in ("qwen",):
            real["mm_token_type_ids"] = torch.tensor(types, dtype=torch.int32)
        if family == "gemma3":
            real["token_type_ids"] = torch.tensor(types, dtype=torch.long)
        if family == "mllama" and n_img:
            # `MllamaProcessor`: each image's tiles attend from its <|image|> token to the next
            # image's, the last to the end (`get_cross_attention_token_mask`,
            # `convert_sparse_cross_attention_mask_to_dense`).
            from transformers.models.mllama.processing_mllama import (
                convert_sparse_cross_attention_mask_to_dense, get_cross_attention_token_mask)
            sparse = [get_cross_attention_token_mask(r, cfg.image_token_index) for r in rows]
            dense = convert_sparse_cross_attention_mask_to_dense(
                sparse, [[info["_num_tiles"]] * n_img] * B, cfg.vision_config.max_num_tiles, total_seq)
            real["cross_attention_mask"] = torch.from_numpy(dense)
            real["aspect_ratio_ids"] = torch.from_numpy(np.ascontiguousarray(
                info["_aspect_ratio_ids"])).reshape(1, 1).repeat(B, n_img)
            real["aspect_ratio_mask"] = torch.from_numpy(np.ascontiguousarray(
                info["_aspect_ratio_mask"])).reshape(1, 1, -1).repeat(B, n_img, 1)
        if n_img:
            pv = torch.from_numpy(np.ascontiguousarray(info["_pixel_values"]))
            if family == "mllama":
                # (1, 1, tiles, 3, H, W) per image -> (B, images, tiles, 3, H, W).
                real["pixel_values"] = pv.reshape(1, 1, *pv.shape[2:]).repeat(B, n_img, 1, 1, 1, 1)
            elif family == "qwen":
                real["pixel_values"] = pv.repeat(B * n_img, 1)
                real["image_grid_thw"] = torch.tensor([info["_grid_thw"]] * (B * n_img), dtype=torch.long)
            else:
                real["pixel_values"] = pv.repeat(B * n_img, *([1] * (pv.dim() - 1)))
            if family == "pixtral":
                real["image_sizes"] = torch.tensor([info["_image_size"]] * (B * n_img), dtype=torch.long)
        real_ctx.__exit__(None, None, None)

        def make_inputs():
            fake = {}
            for k, v in real.items():
                if k == "image_sizes":
                    # Mistral 3 divides it on the device and reads it back (`.tolist()`): a
                    # Python list, which the model takes as well, keeps the values known.
                    fake[k] = v.tolist()
                elif k == "image_grid_thw":
                    fake[k] = shim.host_constant(v)
                else:
                    fake[k] = v.to("cuda")
                    shim.remember(fake[k], v)
            return fake

        ac = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if autocast else contextlib.nullcontext
        step_losses = []
        with tracker:
            tracker.set_phase("setup", "after_load")
            after_load = tracker.current
            for step in range(1, args.steps + 1):
                tracker.set_phase("idle", "step%d.inputs" % step)
                inputs = make_inputs()
                if args.prefill:
                    # `generate`'s prefill: the prompt with its images under no_grad, a
                    # cache, the last position's logits.
                    tracker.set_phase("forward", "prefill")
                    inputs.pop("labels", None)
                    with torch.no_grad(), ac():
                        out = model(**inputs, use_cache=True, logits_to_keep=1)
                    step_losses.append("none (prefill)")
                    del out, inputs
                    break
                tracker.set_phase("forward", "step%d.forward" % step)
                with ac():
                    out = model(**inputs)
                loss = out.loss
                del out
                step_losses.append(str(loss.dtype))
                tracker.set_phase("backward", "step%d.backward" % step)
                loss.backward()
                del loss
                tracker.set_phase("optimizer", "step%d.optimizer" % step)
                opt.step()
                tagger.tag()
                tracker.set_phase("zero_grad", "step%d.zero_grad" % step)
                opt.zero_grad(set_to_none=True)
                del inputs
                gc.collect()
            tracker.set_phase("idle", "end")
            tracker.finish()

    GiB = 1024 ** 3
    phases = {}
    for lbl, pk in tracker.phase_peaks.items():
        if lbl == "setup":
            continue
        phases[lbl] = {"peak_bytes": pk, "end_bytes": tracker.phase_end.get(lbl),
                       "end_by_category": {k: v for k, v in tracker.phase_end_cats.get(lbl, {}).items() if v}}
    text = cfg.get_text_config()
    vc = cfg.vision_config
    res = {
        "oracle": "moro-fake-cuda-oracle/1 + calibration/vlm_trace.py",
        "label": args.label,
        "config_name": os.path.basename(args.config),
        "model_type": model_type,
        "cut": cuts or None,
        "job": {
            "method": method, "precision": precision,
            "param_dtype_frozen_or_base": str(base_dtype).replace("torch.", ""),
            "autocast_bf16": autocast, "optimizer": "torch.optim.AdamW(%s)" % args.adamw_impl,
            "lora": None if method == "full" else {"r": args.lora_r, "alpha": args.lora_alpha,
                                                   "dropout": 0.0, "target_regex": lora_targets,
                                                   "adapter_dtype": "fp32"},
            "train_vision": bool(args.train_vision),
            "input_require_grads_hooks": hooked,
            "vision_tower_in_autograd_graph": bool(n_img) and (bool(args.train_vision) or any(
                n.replace("base_model.model.", "").startswith(vis_prefix) for n in hooked)),
            "vision_attn_implementation": args.vision_attn or args.attn,
            "vision_frozen": not args.train_vision,
            "micro_batch": B, "text_seq": args.seq, "images_per_sample": n_img,
            "image_size": [W, H] if n_img else None, "grad_ckpt": bool(args.grad_ckpt),
            "attn_implementation": args.attn, "steps": args.steps,
            "inputs": sorted(real.keys()),
            "pixel_values_shape": list(real["pixel_values"].shape) if n_img else None,
            "pixel_values_dtype": "float32" if n_img else None,
        },
        "image_tokens_per_image": info["image_tokens"] if n_img else 0,
        "extra_tokens_per_image": info["extra_tokens"] if n_img else 0,
        "image_grid": info.get("grid") if n_img else None,
        "total_seq": total_seq,
        "params": dict(counts, trainable=n_train, trainable_vision=n_train_vision),
        "config": {
            "text_hidden": text.hidden_size, "text_layers": text.num_hidden_layers,
            "vocab": text.vocab_size,
            "vision_hidden": vc.embed_dim if model_type == "qwen2_vl" else getattr(vc, "hidden_size", None),
            "vision_layers": getattr(vc, "depth", getattr(vc, "num_hidden_layers", None)),
        },
        "attention_calls": sdpa.calls,
        "loss_dtype": step_losses[0] if step_losses else None,
        "measured": {
            "peak_allocated_bytes": tracker.peak,
            "peak_allocated_gib": round(tracker.peak / GiB, 4),
            "peak_at": tracker.peak_where,
            "after_load_bytes": after_load,
            "end_bytes": tracker.current,
            "phases": phases,
            "breakdown_at_peak": dict(tracker.peak_cats),
            "breakdown_at_peak_gib": {k: round(v / GiB, 4) for k, v in tracker.peak_cats.items() if v},
        },
        "wall_time_s": round(time.time() - t0, 2),
        "env": dict(oracle.versions(), device_capability_answered="9.0"),
        "notes": notes,
    }
    if args.top > 0:
        res["measured"]["top_live_at_peak"] = tracker.top_live_at_peak(args.top)
    return res


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="HF config.json of the VLM")
    p.add_argument("--matrix", choices=["vlm", "mllama", "vlm-prefill", "image-tokens", "params"])
    p.add_argument("--text-layers", type=int)
    p.add_argument("--vision-layers", type=int)
    p.add_argument("--method", choices=["full", "lora"], default="lora")
    p.add_argument("--precision", choices=["bf16", "bf16-mixed", "fp32"], default="bf16")
    p.add_argument("--adamw-impl", choices=["fused", "foreach", "for"], default="fused")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=512, help="text tokens per sample (image tokens come on top)")
    p.add_argument("--images-per-sample", type=int, default=1)
    p.add_argument("--image-size", default="896x896", help="WxH of each (dummy) image")
    p.add_argument("--train-vision", action="store_true",
                   help="full: train the vision tower and projector too; lora: LoRA on them as well")
    p.add_argument("--grad-ckpt", action="store_true")
    p.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    p.add_argument("--vision-attn", choices=["sdpa", "eager"],
                   help="attention implementation of the vision tower only (default: --attn)")
    p.add_argument("--sdpa-backend", choices=["auto", "flash", "efficient", "math"], default="auto")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--prefill", action="store_true",
                   help="trace generate's prefill (no_grad, a cache, the last logits) instead of a step")
    p.add_argument("--top", type=int, default=0)
    p.add_argument("--label")
    p.add_argument("--out", help="append the result as one JSON line")
    return p


# ------------------------------------------------------------------------------- matrix
# (stem, text layers kept, vision layers kept, extra images case)
MATRIX_MODELS = [
    ("google--gemma-3-4b-it", 4, 8, False),
    ("Qwen--Qwen2.5-VL-3B-Instruct", 4, 8, True),
    ("Qwen--Qwen2-VL-2B-Instruct", 4, 8, True),
    ("llava-hf--llava-1.5-7b-hf", 4, 8, False),
]
MATRIX_CASES = [
    ("lora bf16 frozen", ["--method", "lora", "--precision", "bf16"]),
    ("lora bf16 frozen ckpt", ["--method", "lora", "--precision", "bf16", "--grad-ckpt"]),
    ("full bf16 frozen ckpt", ["--method", "full", "--precision", "bf16", "--grad-ckpt"]),
    ("full bf16 trained-vision ckpt", ["--method", "full", "--precision", "bf16", "--grad-ckpt", "--train-vision"]),
    ("lora bf16-mixed frozen", ["--method", "lora", "--precision", "bf16-mixed"]),
]


def find_config(stem: str) -> str:
    for d in CONFIG_DIRS:
        p = os.path.join(d, stem + ".json")
        if os.path.exists(p):
            return p
    raise FileNotFoundError(stem)


def run_matrix() -> None:
    done = set()
    if os.path.exists(TRACES):
        with open(TRACES) as f:
            done = {json.loads(line).get("label") for line in f if line.strip()}
    os.makedirs(os.path.dirname(TRACES), exist_ok=True)
    for stem, tl, vl, two_images in MATRIX_MODELS:
        config = find_config(stem)
        image_cases = [("1x896x896", ["--images-per-sample", "1", "--image-size", "896x896"])]
        if two_images:
            image_cases.append(("2x1280x720", ["--images-per-sample", "2", "--image-size", "1280x720"]))
        for img_name, img_args in image_cases:
            for case, args in MATRIX_CASES:
                if img_name != "1x896x896" and case not in ("lora bf16 frozen", "full bf16 trained-vision ckpt"):
                    continue
                label = "%s-T%d-V%d %s b1 s512 %s" % (stem, tl, vl, case, img_name)
                if label in done:
                    continue
                cmd = [sys.executable, os.path.abspath(__file__), "--config", config,
                       "--text-layers", str(tl), "--vision-layers", str(vl), *args, *img_args,
                       "--batch", "1", "--seq", "512", "--label", label, "--out", TRACES]
                run_case(label, cmd)
    # Gemma 3 with a long text: its 4-D image mask (mem-efficient SDPA, K/V repeated per head)
    # grows with the sequence squared.
    label = "google--gemma-3-4b-it-T4-V8 lora bf16 frozen b1 s4096 1x896x896"
    if label not in done:
        run_case(label, [sys.executable, os.path.abspath(__file__), "--config",
                         find_config("google--gemma-3-4b-it"), "--text-layers", "4",
                         "--vision-layers", "8", "--method", "lora", "--precision", "bf16",
                         "--images-per-sample", "1", "--image-size", "896x896", "--batch", "1",
                         "--seq", "4096", "--label", label, "--out", TRACES])


MLLAMA_TRACES = os.path.join(ROOT, "validation", "oracle-traces", "vlm-mllama.jsonl")
# Llama 3.2 Vision cut to 4 text layers (the cross-attention layer at 3 kept) and 8 local
# tower layers (its 8 global layers whole): (case, arguments).
MLLAMA_CASES = [
    ("lora bf16 frozen 1x1120x1120", ["--method", "lora", "--precision", "bf16"]),
    ("lora bf16 frozen ckpt 1x1120x1120", ["--method", "lora", "--precision", "bf16", "--grad-ckpt"]),
    ("full bf16 frozen ckpt 1x1120x1120", ["--method", "full", "--precision", "bf16", "--grad-ckpt"]),
    ("full bf16 trained-vision ckpt 1x1120x1120",
     ["--method", "full", "--precision", "bf16", "--grad-ckpt", "--train-vision"]),
    ("lora bf16-mixed frozen 1x1120x1120", ["--method", "lora", "--precision", "bf16-mixed"]),
    ("lora bf16 frozen 2x1120x1120", ["--method", "lora", "--precision", "bf16", "--images-per-sample", "2"]),
    ("lora bf16 frozen 1x560x560", ["--method", "lora", "--precision", "bf16", "--image-size", "560x560"]),
    ("lora bf16 text-only", ["--method", "lora", "--precision", "bf16", "--images-per-sample", "0"]),
]


def run_mllama_matrix() -> None:
    """Every Llama 3.2 Vision case into MLLAMA_TRACES (cases already there are kept)."""
    done = set()
    if os.path.exists(MLLAMA_TRACES):
        with open(MLLAMA_TRACES) as f:
            done = {json.loads(line).get("label") for line in f if line.strip()}
    config = find_config("llama-3.2-11b-vision-shape")
    for case, args in MLLAMA_CASES:
        label = "llama-3.2-11b-vision-shape-T4-V8 %s b1 s512" % case
        if label in done:
            continue
        cmd = [sys.executable, os.path.abspath(__file__), "--config", config, "--text-layers", "4",
               "--vision-layers", "8", "--images-per-sample", "1", "--image-size", "1120x1120",
               *args, "--batch", "1", "--seq", "512", "--label", label, "--out", MLLAMA_TRACES]
        run_case(label, cmd)


PREFILL_TRACES = os.path.join(ROOT, "validation", "oracle-traces", "vlm-prefill.jsonl")
# (config stem, text layers, vision layers, images per sample, image size)
PREFILL_CASES = [
    ("Qwen--Qwen2.5-VL-3B-Instruct", 4, 8, 1, "896x896"),
    ("Qwen--Qwen2.5-VL-3B-Instruct", 4, 8, 2, "1280x720"),
    ("google--gemma-3-4b-it", 4, 8, 1, "896x896"),
    ("llava-hf--llava-1.5-7b-hf", 4, 8, 1, "336x336"),
    ("llama-3.2-11b-vision-shape", 4, 8, 1, "1120x1120"),
    ("llama-3.2-11b-vision-shape", 4, 8, 2, "560x560"),
]


def run_prefill_matrix() -> None:
    """`generate`'s prefill with images, bf16 weights, 512 text tokens: every case into
    PREFILL_TRACES (cases already there are kept)."""
    done = set()
    if os.path.exists(PREFILL_TRACES):
        with open(PREFILL_TRACES) as f:
            done = {json.loads(line).get("label") for line in f if line.strip()}
    for stem, tl, vl, n, size in PREFILL_CASES:
        label = "%s-T%d-V%d prefill b1 s512 %dx%s" % (stem, tl, vl, n, size)
        if label in done:
            continue
        cmd = [sys.executable, os.path.abspath(__file__), "--config", find_config(stem),
               "--text-layers", str(tl), "--vision-layers", str(vl), "--method", "full",
               "--precision", "bf16", "--batch", "1", "--seq", "512", "--prefill",
               "--images-per-sample", str(n), "--image-size", size, "--label", label,
               "--out", PREFILL_TRACES]
        run_case(label, cmd)


def run_case(label: str, cmd: list) -> None:
    print(label, flush=True)
    t = time.time()
    r = subprocess.run(cmd)
    print("  rc=%d %.0fs" % (r.returncode, time.time() - t), flush=True)
    if r.returncode != 0:
        with open(TRACES, "a") as f:
            f.write(json.dumps({"label": label, "failed": True, "returncode": r.returncode}) + "\n")


IMAGE_SIZES = [(224, 224), (640, 480), (896, 896), (1280, 720), (1920, 1080), (4000, 3000)]
TOKEN_MODELS = [
    ("Qwen2.5-VL", "Qwen--Qwen2.5-VL-3B-Instruct", ["hub", "class_default"]),
    ("Qwen2-VL", "Qwen--Qwen2-VL-2B-Instruct", ["hub", "class_default"]),
    ("Gemma 3", "google--gemma-3-4b-it", ["hub"]),
    ("LLaVA-1.5", "llava-hf--llava-1.5-7b-hf", ["hub"]),
    ("Idefics3", None, ["class_default"]),
]


def run_image_tokens() -> None:
    import transformers

    lines = []
    for name, stem, profiles in TOKEN_MODELS:
        if stem is None:
            from transformers import Idefics3Config

            cfg = Idefics3Config()
            cfg_name = "Idefics3Config() defaults (HuggingFaceM4/Idefics3-8B-Llama3 geometry)"
        else:
            cfg, _, _ = load_config(find_config(stem), None, None)
            cfg_name = stem
        fam = family_of(cfg.model_type)
        for prof in profiles:
            for w, h in IMAGE_SIZES:
                r = image_tokens_for(fam, cfg, w, h, prof, with_pixels=False)
                r.pop("_grid_thw", None)
                r.pop("_image_size", None)
                row = {"model": name, "config": cfg_name, "preprocessor_profile": prof,
                       "processor_class": r.pop("processor_class"),
                       "transformers_version": transformers.__version__}
                row.update(r)
                lines.append(row)
    with open(IMAGE_TOKENS, "w") as f:
        for row in lines:
            f.write(json.dumps(row) + "\n")
    print("wrote %d lines to %s" % (len(lines), IMAGE_TOKENS))


PARAM_STEMS = [
    "Qwen--Qwen2.5-VL-3B-Instruct", "Qwen--Qwen2.5-VL-7B-Instruct", "Qwen--Qwen2.5-VL-32B-Instruct",
    "Qwen--Qwen2.5-VL-72B-Instruct", "Qwen--Qwen2-VL-2B-Instruct", "Qwen--Qwen2-VL-7B-Instruct",
    "llava-hf--llava-1.5-7b-hf", "google--gemma-3-4b-it", "google--gemma-3-12b-it", "google--gemma-3-27b-it",
    "HuggingFaceTB--SmolVLM-256M-Instruct", "HuggingFaceTB--SmolVLM-500M-Instruct",
    "HuggingFaceTB--SmolVLM-Instruct",
]


def run_params() -> None:
    import torch
    import transformers
    from transformers import AutoModelForImageTextToText

    warnings.filterwarnings("ignore")
    out = {"transformers_version": transformers.__version__, "torch_version": torch.__version__,
           "method": "AutoModelForImageTextToText.from_config(config) on the meta device; "
                     "named_parameters() (tied weights listed once); language_model excludes "
                     "embed_tokens; lm_head 0 when tied", "models": {}}
    for stem in PARAM_STEMS:
        try:
            path = find_config(stem)
        except FileNotFoundError:
            continue
        cfg, model_type, _ = load_config(path, None, None)
        with torch.device("meta"):
            model = AutoModelForImageTextToText.from_config(cfg)
        c = param_counts(model, family_of(model_type))
        c["config_file"] = os.path.relpath(path, ROOT)
        out["models"][stem] = c
        print(stem, c["total"], flush=True)
        del model
        gc.collect()
    with open(PARAMS, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


def main() -> None:
    args = build_parser().parse_args()
    if args.matrix == "vlm":
        run_matrix()
        return
    if args.matrix == "mllama":
        run_mllama_matrix()
        return
    if args.matrix == "vlm-prefill":
        run_prefill_matrix()
        return
    if args.matrix == "image-tokens":
        run_image_tokens()
        return
    if args.matrix == "params":
        run_params()
        return
    if not args.config:
        sys.exit("vlm_trace: --config is required")
    res = run(args)
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(res) + "\n")
    m = res["measured"]
    print("%s: image tokens %s, seq %d, peak_allocated %.4f GiB at %s (%.0fs)" % (
        args.label or res["config_name"], res["image_tokens_per_image"], res["total_seq"],
        m["peak_allocated_gib"], m["peak_at"], res["wall_time_s"]))
    print(json.dumps(m["breakdown_at_peak_gib"]))
    print(json.dumps(res["attention_calls"]))


if __name__ == "__main__":
    main()
