"""The continuous-batching settings the canary refuses, and why, checked as early as each becomes known.

The canary stamps and verifies the tokens the engine writes through its own per-step write index, one sequence
position per slot, around a forward that runs eagerly on a known stream. A setting that changes where or when
K/V is written, or what a slot means, would make that bookkeeping wrong; it is refused with an
:class:`UnsupportedSettingError` naming the setting, never silently guarded half-way:

* **sliding-window or hybrid layers** (``config.sliding_window``, ``config.layer_types``): those layers keep a
  ring buffer in an index space of their own (position ``p`` lives at ``p % window``);
* **flash attention** (``attn_implementation`` containing ``"flash"``, including the switch
  ``ContinuousBatchingConfig(auto_switch_to_flash=True)`` makes when a flash kernel is installed) and its
  **decode fast path** (``max_blocks_per_request > 0``): the kernel writes K/V itself through a block table, not
  through the write index the canary reads;
* **CUDA graphs** (``use_cuda_graph``, or the padding intervals that turn them on) and **torch.compile**
  (``varlen_compile_config``, ``decode_compile_config``, ``default_compile_level``): replayed or compiled
  forwards are padded to fixed sizes, the padding tokens write to the trash sector, and the canary's host-side
  steps would not be captured;
* **async double-buffered batching** (``use_async_batching``): the next batch is prepared while the current
  forward runs, and its decode tokens are placeholders until the device patches them in;
* **tensor parallel** (a model sharded over a device mesh): each rank holds a slice of the KV heads in its own
  cache.

Messages start with ``kv-canary:`` and name the setting and what to use instead.
"""

from __future__ import annotations

from typing import Any

from kvcanary.errors import PREFIX

FULL_ATTENTION = "full_attention"


class UnsupportedSettingError(ValueError):
    """A continuous-batching setting the canary cannot guard (see the module docstring)."""


def _refuse(message: str) -> UnsupportedSettingError:
    return UnsupportedSettingError(PREFIX + message)


def _text_config(model: Any) -> Any:
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def check_model(model: Any) -> None:
    """Refuse a model whose layers or attention implementation the canary cannot guard (known at attach time).

    Raises :class:`UnsupportedSettingError` for sliding-window or hybrid layer groups, a flash attention
    implementation, and a model sharded for tensor parallelism.
    """
    from transformers.generation.continuous_batching.cache import group_layers_by_attn_type

    cfg = _text_config(model)
    groups = list(group_layers_by_attn_type(cfg))
    if groups != [FULL_ATTENTION]:
        raise _refuse(
            f"sliding-window attention is not supported: the model's layer groups are {groups} "
            f"(config.sliding_window={getattr(cfg, 'sliding_window', None)!r}, "
            f"config.layer_types={getattr(cfg, 'layer_types', None)!r}); the canary guards full-attention layers "
            "only, whose positions map one to one onto cache slots")
    check_attention(model)
    if getattr(model, "_device_mesh", None) is not None:
        raise _refuse("tensor parallel is not supported: the model is sharded over a device mesh "
                      "(tp_plan / device_mesh); each rank's cache holds a slice of the KV heads")


def check_attention(model: Any) -> None:
    """Refuse a flash attention implementation (the kernel writes K/V itself through a block table)."""
    impl = getattr(model.config, "_attn_implementation", None)
    if impl is not None and "flash" in str(impl):
        raise _refuse(
            f"flash attention is not supported (attn_implementation={impl!r}): its kernels write K/V through a "
            "block table instead of the write index the canary reads; load the model with "
            "attn_implementation='sdpa' or 'eager' and use ContinuousBatchingConfig(auto_switch_to_flash=False)")


def check_manager(manager: Any) -> None:
    """Refuse what a resolved ``ContinuousBatchingConfig`` turns on (known once the manager exists).

    Raises :class:`UnsupportedSettingError` for flash attention (also when ``auto_switch_to_flash`` switched to
    it), the flash decode fast path, CUDA graphs, torch.compile, async batching and tensor parallelism.
    """
    check_model(manager.model)
    cfg = manager.continuous_batching_config
    if (cfg.max_blocks_per_request or 0) > 0:
        raise _refuse(f"the flash decode fast path is not supported (ContinuousBatchingConfig.max_blocks_per_request="
                      f"{cfg.max_blocks_per_request}): its kernel writes K/V through a block table; set it to 0")
    if any(cfg.cuda_graph_booleans):
        raise _refuse(f"CUDA graphs are not supported (ContinuousBatchingConfig.use_cuda_graph={cfg.use_cuda_graph!r}, "
                      f"q_padding_interval_size={cfg.q_padding_interval_size}, kv_padding_interval_size="
                      f"{cfg.kv_padding_interval_size}): replays are padded and skip the canary's host-side steps; "
                      "set use_cuda_graph=False")
    if cfg.varlen_compile_config is not None or cfg.decode_compile_config is not None:
        raise _refuse("torch.compile of the forward is not supported (ContinuousBatchingConfig.varlen_compile_config="
                      f"{cfg.varlen_compile_config!r}, decode_compile_config={cfg.decode_compile_config!r}, "
                      f"default_compile_level={cfg.default_compile_level}): compiled forwards are padded to fixed "
                      "sizes; leave them unset and default_compile_level=0")
    if cfg.use_async_batching:
        raise _refuse("async double-buffered batching is not supported (ContinuousBatchingConfig.use_async_batching="
                      "True): the next batch is prepared while the forward runs, with placeholder decode tokens; "
                      "set use_async_batching=False")
    tp = getattr(getattr(manager, "distributed_helper", None), "tp_size", 1)
    if tp > 1:
        raise _refuse(f"tensor parallel is not supported (tensor parallel size {tp}): each rank's cache holds a "
                      "slice of the KV heads")


def check_processor(processor: Any) -> None:
    """Backstop on the built batch processor (its cache, IOs and model runner), whatever path built it."""
    from transformers.generation.continuous_batching.input_outputs import ContinuousBatchingAsyncIOs

    groups = list(processor.cache.cache_allocators)
    if groups != [FULL_ATTENTION]:
        raise _refuse(f"sliding-window attention is not supported: the cache's layer groups are {groups}; the canary "
                      "guards full-attention layers only")
    if processor.cache.max_blocks_per_request > 0:
        raise _refuse("the flash decode fast path is not supported (ContinuousBatchingConfig.max_blocks_per_request="
                      f"{processor.cache.max_blocks_per_request}); set it to 0")
    if processor.model_runner.pad_inputs:
        raise _refuse("padded inputs (CUDA graphs or torch.compile: ContinuousBatchingConfig.use_cuda_graph, "
                      "varlen_compile_config, decode_compile_config) are not supported")
    if isinstance(processor.inputs_and_outputs, ContinuousBatchingAsyncIOs):
        raise _refuse("async double-buffered batching is not supported (ContinuousBatchingConfig.use_async_batching)")
    if processor.distributed_helper.tp_size > 1:
        raise _refuse(f"tensor parallel is not supported (tensor parallel size {processor.distributed_helper.tp_size})")
