"""The vLLM log grammar over exact journal lines of every format era, 0.6 to 0.34.

Eras (how a line is wrapped), as each release's logging code writes it:
  0.6    "INFO 05-12 10:11:12 file.py:122] msg"                      (0.6.x-0.7.x, no brackets)
  0.8    "INFO 05-12 10:11:12 [file.py:122] msg"                     (0.8-0.10.0, TP=1 unprefixed)
  0.10.1 "(EngineCore_0 pid=N) INFO ... [file.py:N] msg"
  0.10.2 "ESC[1;36m(EngineCore_DP0 pid=N)ESC[0;0m INFO ... msg"      (0.10.2-0.17, coloured prefix)
  0.18   "(EngineCore pid=N) INFO ... [v1/engine/core.py:N] msg"     (0.18-0.30, relpath when DEBUG)
  0.31   "(EngineCore pid=N) INFO ... [file.py:N] msg" in the format (raw stderr unprefixed)
  raw    the multiprocessing copy of a traceback: no header, prefixed before 0.31
"""

from __future__ import annotations

import dataclasses
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_xpu_exporter.parsers.vllm import (
    GRAMMAR,
    MAX_LINE_CHARS,
    PLAUSIBLE,
    EngineConfig,
    EngineInitDone,
    FailureCause,
    FailureReason,
    FailureWrapper,
    ImplausibleValue,
    KvCacheBlocks,
    KvCacheCapacity,
    KvCacheMemory,
    KvMemorySource,
    MaxModelLenAutoFit,
    MemoryUsage,
    ModelWeights,
    ProfilingAfter,
    ProfilingBefore,
    ServerReady,
    ServerVersion,
    Settings,
    SettingsSource,
    SleepFreed,
    Woke,
    StartupPlan,
    StartupPlanOutcome,
    WrapperKind,
    default_gpu_memory_utilization,
    kv_cache_bytes_from_profiling,
    normalise,
    parse_line,
)
from sizes import GiB, gib, mib

pytestmark = pytest.mark.fast  # the pure core (pyproject.toml's markers; `pytest -m fast`)

R = FailureReason
NON_DEFAULT = SettingsSource.NON_DEFAULT_ARGS
NAMESPACE = SettingsSource.ARGS_NAMESPACE
BANNER = SettingsSource.SERVER_BANNER
CYAN, RESET = "\x1b[1;36m", "\x1b[0;0m"


# (grammar row, era, exact journal line, expected event)
# fmt: off
EXACT_LINES: list[tuple[str, str, str, object]] = [
    # --- identity ----------------------------------------------------------------------------
    ("api_server_version", "0.6",
     "INFO 10-15 09:12:01 api_server.py:528] vLLM API server version 0.6.3.post1",
     ServerVersion("0.6.3.post1")),
    ("api_server_version", "0.8",
     "INFO 04-07 05:27:40 [api_server.py:981] vLLM API server version 0.8.3",
     ServerVersion("0.8.3")),
    ("api_server_version", "0.10.1",
     "(APIServer pid=206609) INFO 11-06 18:40:44 [api_server.py:1873] vLLM API server version "
     "0.10.1rc2.dev189+ge2db1164a",
     ServerVersion("0.10.1rc2.dev189+ge2db1164a")),
    ("api_server_version", "0.10.2",
     f"{CYAN}(APIServer pid=4021){RESET} INFO 12-14 15:35:25 [api_server.py:1351] "
     "vLLM API server version 0.13.0",
     ServerVersion("0.13.0")),
    ("server_version_model", "0.18",
     "(APIServer pid=1) INFO 05-14 08:20:13 [utils.py:299] vLLM server version 0.20.2, "
     "serving model Qwen/Qwen3-0.6B",
     ServerVersion("0.20.2", "Qwen/Qwen3-0.6B")),
    ("server_version_model", "0.31",
     "(APIServer pid=7) INFO 07-02 11:00:00 [utils.py:310] vLLM server version 0.33.0, "
     "serving model /models/Qwen3-8B",
     ServerVersion("0.33.0", "/models/Qwen3-8B")),
    ("banner_version", "0.10.2",
     "(APIServer pid=11980) INFO 02-12 19:33:39 [utils.py:325]  ▄▄ ▄█ █     █     █ ▀▄▀ █  "
     "version 0.15.1",
     ServerVersion("0.15.1")),
    ("banner_version", "0.18",
     "(APIServer pid=1) INFO 04-19 10:51:55 [utils.py:299]  ▄▄ ▄█ █     █     █ ▀▄▀ █  "
     "version 0.19.0",
     ServerVersion("0.19.0")),
    ("banner_version", "0.31",
     "(APIServer pid=1) INFO 06-01 21:51:24 [utils.py:344]  \x1b[93m▄▄\x1b[0m \x1b[94m▄█\x1b[0m "
     "\x1b[1m█     █     █ ▀▄▀ █\x1b[0m  version \x1b[1m0.32.0rc1.dev26+g4721bb3aa\x1b[0m",
     ServerVersion("0.32.0rc1.dev26+g4721bb3aa")),
    ("banner_model", "0.10.2",
     "(APIServer pid=11980) INFO 02-12 19:33:39 [utils.py:325]   █▄█▀ █     █     █     █  "
     "model   openai/whisper-large-v3",
     Settings(BANNER, model="openai/whisper-large-v3")),
    ("banner_model", "0.18",
     "(APIServer pid=1) INFO 04-19 10:51:55 [utils.py:299]   █▄█▀ █     █     █     █  "
     "model   RedHatAI/gemma-4-26B-A4B-it-NVFP4",
     Settings(BANNER, model="RedHatAI/gemma-4-26B-A4B-it-NVFP4")),
    ("engine_config", "0.6",
     "INFO 10-15 09:12:02 llm_engine.py:237] Initializing an LLM engine (v0.6.3.post1) with config: "
     "model='Qwen/Qwen2.5-7B-Instruct', speculative_config=None, tokenizer='Qwen/Qwen2.5-7B-Instruct', "
     "skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, override_neuron_config=None, "
     "rope_scaling=None, rope_theta=None, tokenizer_revision=None, trust_remote_code=False, "
     "dtype=torch.float16, max_seq_len=8192, download_dir=None, load_format=LoadFormat.AUTO, "
     "tensor_parallel_size=1, pipeline_parallel_size=1, disable_custom_all_reduce=False, "
     "quantization=None, enforce_eager=True, kv_cache_dtype=auto, quantization_param_path=None, "
     "device_config=xpu, decoding_config=DecodingConfig(guided_decoding_backend='outlines'), "
     "observability_config=ObservabilityConfig(otlp_traces_endpoint=None), seed=0, "
     "served_model_name=Qwen/Qwen2.5-7B-Instruct, use_v2_block_manager=True, num_scheduler_steps=1, "
     "chunked_prefill_enabled=False multi_step_stream_outputs=True, enable_prefix_caching=False, "
     "use_async_output_proc=True, use_cached_outputs=True, mm_processor_kwargs=None)",
     EngineConfig("0.6.3.post1", "V0", "Qwen/Qwen2.5-7B-Instruct", 8192)),
    ("engine_config", "0.8",
     "INFO 04-07 05:27:51 [llm_engine.py:241] Initializing a V0 LLM engine (v0.8.3) with config: "
     "model='meta-llama/Llama-3.2-1B-Instruct', speculative_config=None, "
     "tokenizer='meta-llama/Llama-3.2-1B-Instruct', skip_tokenizer_init=False, tokenizer_mode=auto, "
     "revision=None, override_neuron_config=None, tokenizer_revision=None, trust_remote_code=False, "
     "dtype=torch.float16, max_seq_len=131072, download_dir=None, load_format=auto, "
     "tensor_parallel_size=1, pipeline_parallel_size=1, disable_custom_all_reduce=False, "
     "quantization=None, enforce_eager=True, kv_cache_dtype=auto,  device_config=xpu, seed=0",
     EngineConfig("0.8.3", "V0", "meta-llama/Llama-3.2-1B-Instruct", 131072)),
    ("engine_config", "0.10.1",
     "(EngineCore_0 pid=207574) INFO 11-06 18:41:02 [core.py:74] Initializing a V1 LLM engine "
     "(v0.10.1rc2.dev189+ge2db1164a) with config: model='meta-llama/Llama-2-7b-chat-hf', "
     "speculative_config=None, tokenizer='meta-llama/Llama-2-7b-chat-hf', skip_tokenizer_init=False, "
     "tokenizer_mode=auto, revision=None, override_neuron_config={}, tokenizer_revision=None, "
     "trust_remote_code=False, dtype=torch.float16, max_seq_len=4096, download_dir=None, "
     "load_format=auto, tensor_parallel_size=1, pipeline_parallel_size=1, "
     "disable_custom_all_reduce=True, quantization=None, enforce_eager=False, kv_cache_dtype=auto, "
     "device_config=xpu, seed=0, served_model_name=meta-llama/Llama-2-7b-chat-hf, "
     "enable_prefix_caching=True, chunked_prefill_enabled=True, use_async_output_proc=True, "
     'pooler_config=None, compilation_config={"level":0,"debug_dump_path":"","cache_dir":"",'
     '"backend":"","custom_ops":[],"splitting_ops":null,"use_inductor":true,"compile_sizes":[],'
     '"cudagraph_mode":0,"max_capture_size":512,"local_cache_dir":null}',
     EngineConfig("0.10.1rc2.dev189+ge2db1164a", "V1", "meta-llama/Llama-2-7b-chat-hf", 4096)),
    ("engine_config", "0.10.2",
     f"{CYAN}(EngineCore_DP0 pid=1594645){RESET} INFO 12-14 15:35:48 [core.py:93] Initializing a V1 "
     "LLM engine (v0.13.0) with config: model='/models/Qwen3-8B', speculative_config=None, "
     "tokenizer='/models/Qwen3-8B', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, "
     "tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=40960, "
     "download_dir=None, load_format=auto, tensor_parallel_size=1, device_config=xpu, seed=0",
     EngineConfig("0.13.0", "V1", "/models/Qwen3-8B", 40960)),
    ("engine_config", "0.18",
     "(EngineCore pid=29655) INFO 09-30 16:06:26 [v1/engine/core.py:105] Initializing a V1 LLM "
     "engine (v0.19.1) with config: model='Qwen/Qwen3-8B', speculative_config=None, "
     "tokenizer='Qwen/Qwen3-8B', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, "
     "tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=32768, "
     "download_dir=None, load_format=auto, tensor_parallel_size=1, pipeline_parallel_size=1",
     EngineConfig("0.19.1", "V1", "Qwen/Qwen3-8B", 32768)),
    ("engine_config", "0.31",
     "(EngineCore pid=1234) INFO 07-02 11:00:05 [core.py:129] Initializing a V1 LLM engine "
     "(v0.33.0) with config: model='/srv/models/Qwen3-0.6B', speculative_config=None, "
     "tokenizer='/srv/models/Qwen3-0.6B', skip_tokenizer_init=False, tokenizer_mode=auto, "
     "revision=None, tokenizer_revision=None, trust_remote_code=False, dtype=torch.float16, "
     "max_seq_len=16384, download_dir=None, load_format=auto, tensor_parallel_size=1",
     EngineConfig("0.33.0", "V1", "/srv/models/Qwen3-0.6B", 16384)),
    # --- settings ----------------------------------------------------------------------------
    ("args_namespace", "0.6",
     "INFO 10-15 09:12:01 api_server.py:529] args: Namespace(subparser='serve', "
     "model_tag='Qwen/Qwen2.5-7B-Instruct', config='', host=None, port=8000, "
     "uvicorn_log_level='info', allow_credentials=False, allowed_origins=['*'], api_key=None, "
     "lora_modules=None, chat_template=None, model='Qwen/Qwen2.5-7B-Instruct', tokenizer=None, "
     "block_size=16, gpu_memory_utilization=0.45, max_model_len=8192, max_num_seqs=256, "
     "dtype='float16', kv_cache_dtype='auto', seed=0, swap_space=4, cpu_offload_gb=0, "
     "num_gpu_blocks_override=None, dispatch_function=<function serve at 0x7f3a2c1e5b40>)",
     Settings(NAMESPACE, model="Qwen/Qwen2.5-7B-Instruct", gpu_memory_utilization=0.45,
              max_model_len=8192, max_num_seqs=256, block_size=16)),
    ("args_namespace", "0.8",
     "INFO 04-07 05:27:40 [api_server.py:982] args: Namespace(host='0.0.0.0', port=8000, "
     "model='meta-llama/Llama-3.2-1B-Instruct', task='auto', block_size=None, "
     "gpu_memory_utilization=0.9, max_model_len=None, max_num_seqs=None, disable_log_stats=False)",
     Settings(NAMESPACE, model="meta-llama/Llama-3.2-1B-Instruct", gpu_memory_utilization=0.9)),
    ("non_default_args", "0.8",
     "INFO 06-10 10:00:00 [api_server.py:1289] non-default args: "
     "{'model': 'Qwen/Qwen2.5-1.5B-Instruct', 'gpu_memory_utilization': 0.5}",
     Settings(NON_DEFAULT, model="Qwen/Qwen2.5-1.5B-Instruct", gpu_memory_utilization=0.5)),
    ("non_default_args", "0.10.1",
     "(APIServer pid=206609) INFO 11-06 18:40:44 [utils.py:326] non-default args: "
     "{'model_tag': 'meta-llama/Llama-2-7b-chat-hf', 'model': 'meta-llama/Llama-2-7b-chat-hf'}",
     Settings(NON_DEFAULT, model="meta-llama/Llama-2-7b-chat-hf")),
    ("non_default_args", "0.10.2",
     f"{CYAN}(APIServer pid=4021){RESET} INFO 09-30 16:06:20 [utils.py:253] non-default args: "
     "{'model_tag': 'Qwen/Qwen3-8B', 'host': '0.0.0.0', 'model': 'Qwen/Qwen3-8B', "
     "'max_model_len': 32768, 'gpu_memory_utilization': 0.45, 'max_num_seqs': 64, "
     "'kv_cache_memory_bytes': 5713920000, 'enable_prefix_caching': True}",
     Settings(NON_DEFAULT, model="Qwen/Qwen3-8B", gpu_memory_utilization=0.45, max_model_len=32768,
              max_num_seqs=64, kv_cache_memory_bytes=5713920000)),
    ("non_default_args", "0.18",
     "(APIServer pid=1) INFO 04-03 15:05:37 [utils.py:233] non-default args: "
     "{'model_tag': 'Qwen/Qwen3-0.6B', 'model': 'Qwen/Qwen3-0.6B', 'max_model_len': 8192, "
     "'gpu_memory_utilization': 0.3, 'max_num_seqs': 32, 'block_size': 64}",
     Settings(NON_DEFAULT, model="Qwen/Qwen3-0.6B", gpu_memory_utilization=0.3,
              max_model_len=8192, max_num_seqs=32, block_size=64)),
    # Not a Python literal (a dataclass repr inside): the per-key fallback reads it.
    ("non_default_args", "0.31",
     "(APIServer pid=1) INFO 07-02 11:00:00 [startup.py:88] non-default args: "
     "{'model_tag': 'Qwen/Qwen3-8B', 'model': 'Qwen/Qwen3-8B', "
     "'compilation_config': CompilationConfig(mode=<CompilationMode.NONE: 0>), "
     "'gpu_memory_utilization': 0.45, 'kv_cache_memory_bytes': 4294967296}",
     Settings(NON_DEFAULT, model="Qwen/Qwen3-8B", gpu_memory_utilization=0.45,
              kv_cache_memory_bytes=4294967296)),
    # --- KV-cache budget ---------------------------------------------------------------------
    ("available_kv_cache_memory", "0.10.2",
     f"{CYAN}(EngineCore_DP0 pid=3052){RESET} INFO 11-20 10:00:00 [gpu_worker.py:298] "
     "Available KV cache memory: 12.34 GiB",
     KvCacheMemory(gib(12.34), KvMemorySource.AVAILABLE)),
    ("available_kv_cache_memory", "0.18",
     "(EngineCore pid=3310) INFO 08-11 13:56:10 [gpu_worker.py:456] Available KV cache memory: 15.5 GiB",
     KvCacheMemory(gib(15.5), KvMemorySource.AVAILABLE)),
    ("available_kv_cache_memory", "0.31",
     "(EngineCore pid=1234) INFO 05-12 10:11:12 [gpu_worker.py:796] Available KV cache memory: -1.37 GiB",
     KvCacheMemory(-gib(1.37), KvMemorySource.AVAILABLE)),
    ("kv_cache_memory_bytes_reserved", "0.10.2",
     f"{CYAN}(EngineCore_DP0 pid=3052){RESET} INFO 09-15 10:00:00 [gpu_worker.py:276] Initial free "
     "memory 22.456787109375 GiB, reserved 4.00GiB memory for KV Cache as specified by "
     "kv_cache_memory_bytes config and skipped memory profiling. This does does not respect the "
     "gpu_memory_utilization config. Only use kv_cache_memory_bytes config when you want manual "
     "control of KV cache memory size.",
     KvCacheMemory(gib(4.0), KvMemorySource.RESERVED, initial_free_bytes=gib(22.456787109375))),
    ("kv_cache_memory_bytes_reserved", "0.18",
     "(EngineCore pid=29655) INFO 09-30 16:07:24 [gpu_worker.py:361] Initial free memory 77.91 GiB, "
     "reserved 5.32 GiB memory for KV Cache as specified by kv_cache_memory_bytes config and "
     "skipped memory profiling. This does not respect the gpu_memory_utilization config.",
     KvCacheMemory(gib(5.32), KvMemorySource.RESERVED, initial_free_bytes=gib(77.91))),
    ("kv_cache_memory_bytes_reserved", "0.31",
     "(EngineCore pid=2122) INFO 09-19 12:40:21 [gpu_worker.py:381] Initial free memory 10.18 GiB, "
     "reserved 0.73 GiB memory for KV Cache as specified by kv_cache_memory_bytes config and "
     "skipped memory profiling. This does not respect the gpu_memory_utilization config.",
     KvCacheMemory(gib(0.73), KvMemorySource.RESERVED, initial_free_bytes=gib(10.18))),
    ("profiling_before", "0.8",
     "INFO 07-10 10:00:00 [xpu_worker.py:104] Before memory profiling run, total GPU memory: "
     "24480.00 MB, model load takes 1024.50 MB, free gpu memory is 23327.50 MB.",
     ProfilingBefore(mib(24480.00), mib(1024.50), mib(23327.50))),
    ("profiling_before", "0.10.1",
     "(EngineCore_0 pid=207574) INFO 11-06 18:41:09 [xpu_worker.py:104] Before memory profiling "
     "run, total GPU memory: 65520.00 MB, model load takes 12870.74 MB, free gpu memory is "
     "52435.44 MB.",
     ProfilingBefore(mib(65520.00), mib(12870.74), mib(52435.44))),
    ("profiling_before", "0.10.2",
     f"{CYAN}(EngineCore_DP0 pid=812){RESET} INFO 01-20 08:00:00 [xpu_worker.py:112] Before memory "
     "profiling run, total GPU memory: 24480.00 MB, model load takes 8204.13 MB, free gpu memory "
     "is 16147.87 MB.",
     ProfilingBefore(mib(24480.00), mib(8204.13), mib(16147.87))),
    ("profiling_after", "0.8",
     "INFO 07-10 10:00:01 [xpu_worker.py:139] After memory profiling run, peak memory usage is "
     "1402.11 MB,torch mem is 1024.50 MB, non-torch mem is 128.00 MB, free gpu memory is "
     "22949.89 MB.",
     ProfilingAfter(mib(1402.11), mib(1024.50), mib(128.00), mib(22949.89))),
    ("profiling_after", "0.10.1",
     "(EngineCore_0 pid=207574) INFO 11-06 18:41:10 [xpu_worker.py:139] After memory profiling "
     "run, peak memory usage is 13552.69 MB,torch mem is 12870.74 MB, non-torch mem is 426.94 MB, "
     "free gpu memory is 51896.32 MB.",
     ProfilingAfter(mib(13552.69), mib(12870.74), mib(426.94), mib(51896.32))),
    ("profiling_after", "0.10.2",
     f"{CYAN}(EngineCore_DP0 pid=812){RESET} INFO 01-20 08:00:02 [xpu_worker.py:147] After memory "
     "profiling run, peak memory usage is 9013.40 MB,torch mem is 8204.13 MB, non-torch mem is "
     "128.00 MB, free gpu memory is 15338.60 MB.",
     ProfilingAfter(mib(9013.40), mib(8204.13), mib(128.00), mib(15338.60))),
    # --- weights and the start-up memory summary (the planner's split of the non-KV memory) ------
    ("model_loading_took", "0.6",
     "INFO 10-15 09:12:40 xpu_model_runner.py:410] Loading model weights took 2.4530 GB",
     ModelWeights(gib(2.4530))),
    ("model_loading_took", "0.10.1",
     "(EngineCore_0 pid=207574) INFO 11-06 18:41:08 [gpu_model_runner.py:2018] Model loading took "
     "12.5533 GiB and 5.050575 seconds",
     ModelWeights(gib(12.5533))),
    ("model_loading_took", "0.18",
     "(EngineCore pid=2301) INFO 05-12 10:11:30 [gpu_model_runner.py:2392] Model loading took 8.58 GiB "
     "memory and 11.400000 seconds",
     ModelWeights(gib(8.58))),
    # 0.26-0.27: weight, peak activation and non-torch apart; opens like the insufficient_free_memory failure
    ("startup_memory_usage", "0.18",
     "(EngineCore pid=812) INFO 03-02 09:15:38 [gpu_worker.py:436] Free memory on device (15.42/15.91 GiB) on "
     "startup. Desired GPU memory utilization is (0.75, 11.93 GiB). Actual usage is 8.58 GiB for weight, 0.51 "
     "GiB for peak activation, 0.12 GiB for non-torch memory, and 0.0 GiB for CUDAGraph memory. Replace "
     "gpu_memory_utilization config with `--kv-cache-memory=3420000000` (3.19 GiB) to fit into requested "
     "memory, or `--kv-cache-memory=7000000000` (6.52 GiB) to fully utilize gpu memory. Current kv cache "
     "memory in use is 3.25 GiB.",
     MemoryUsage(gib(0.51), 0, weights_bytes=gib(8.58), non_torch_bytes=gib(0.12), free_bytes=gib(15.42),
                 total_bytes=gib(15.91))),
    # 0.28+: weights and non-torch as one "consumed" figure
    ("startup_memory_usage", "0.31",
     "(EngineCore pid=812) INFO 03-02 09:15:38 [gpu_worker.py:412] Free memory on device (15.42/15.91 GiB) on "
     "startup. Desired GPU memory utilization is (0.8, 12.73 GiB). Actual usage is 4.1 GiB for consumed memory "
     "(weights + non-torch), 0.9 GiB for peak activation, and 0.0 GiB for CUDAGraph memory.",
     MemoryUsage(gib(0.9), 0, consumed_bytes=gib(4.1), free_bytes=gib(15.42), total_bytes=gib(15.91))),
    # a runtime that misreports free memory (vllm-project/vllm#49482): 0 free of 22.71 GiB, a start that went on
    ("startup_memory_usage", "0.31",
     "(EngineCore pid=812) INFO 03-02 09:15:38 [gpu_worker.py:412] Free memory on device (0.0/22.71 GiB) on "
     "startup. Desired GPU memory utilization is (0.8, 18.17 GiB). Actual usage is 4.1 GiB for consumed memory "
     "(weights + non-torch), 0.9 GiB for peak activation, and 0.0 GiB for CUDAGraph memory.",
     MemoryUsage(gib(0.9), 0, consumed_bytes=gib(4.1), free_bytes=0, total_bytes=gib(22.71))),
    # --- KV-cache capacity -------------------------------------------------------------------
    ("kv_cache_size_tokens", "0.8",
     "INFO 04-07 05:28:10 [kv_cache_utils.py:537] GPU KV cache size: 123,456 tokens",
     KvCacheCapacity(123456, None, None, "GPU")),
    ("kv_cache_size_tokens", "0.10.1",
     "(EngineCore_0 pid=207574) INFO 11-06 18:41:10 [kv_cache_utils.py:849] GPU KV cache size: "
     "90,816 tokens",
     KvCacheCapacity(90816, None, None, "GPU")),
    ("kv_cache_size_tokens", "0.10.2",
     "\x1b[0;36m(EngineCore_DP0 pid=3052)\x1b[0;0m INFO 01-15 06:46:16 [kv_cache_utils.py:1286] "
     "GPU KV cache size: 1,880,320 tokens",
     KvCacheCapacity(1880320, None, None, "GPU")),
    ("kv_cache_size_tokens", "0.18",
     "(EngineCore pid=2122) INFO 09-19 12:40:21 [kv_cache_utils.py:1710] GPU KV cache size: "
     "112,347 tokens, Maximum concurrency for 98,304 tokens per request: 1.14x",
     KvCacheCapacity(112347, 98304, 1.14, "GPU")),
    ("kv_cache_size_tokens", "0.18",
     "(EngineCore pid=812) INFO 03-02 09:15:40 [kv_cache_utils.py:1744] XPU KV cache size: "
     "54,880 tokens, Maximum concurrency for 8,192 tokens per request: 6.70x",
     KvCacheCapacity(54880, 8192, 6.70, "XPU")),
    ("kv_cache_size_tokens", "0.31",
     "(EngineCore pid=1234) INFO 07-02 11:01:00 [kv_cache_utils.py:2481] XPU + host KV cache size: "
     "1,048,576 tokens, Maximum concurrency for 131,072 tokens per request: 8.00x",
     KvCacheCapacity(1048576, 131072, 8.0, "XPU + host")),
    ("max_concurrency", "0.6",
     "INFO 10-15 09:13:00 gpu_executor.py:126] Maximum concurrency for 8192 tokens per request: 9.16x",
     KvCacheCapacity(None, 8192, 9.16, None)),
    ("max_concurrency", "0.8",
     "INFO 04-07 05:28:10 [executor_base.py:116] Maximum concurrency for 131072 tokens per "
     "request: 1.05x",
     KvCacheCapacity(None, 131072, 1.05, None)),
    ("max_concurrency", "0.10.1",
     "(EngineCore_0 pid=207574) INFO 11-06 18:41:10 [kv_cache_utils.py:853] Maximum concurrency "
     "for 4,096 tokens per request: 22.17x",
     KvCacheCapacity(None, 4096, 22.17, None)),
    ("max_concurrency", "0.10.2",
     f"{CYAN}(EngineCore_DP0 pid=3052){RESET} INFO 01-15 06:46:16 [kv_cache_utils.py:1291] "
     "Maximum concurrency for 32,768 tokens per request: 57.38x",
     KvCacheCapacity(None, 32768, 57.38, None)),
    ("max_concurrency", "0.18",
     "(EngineCore pid=3310) INFO 08-11 13:56:12 [kv_cache_utils.py:1295] Maximum concurrency for "
     "40,960 tokens per request: 2.50x",
     KvCacheCapacity(None, 40960, 2.5, None)),
    ("kv_cache_blocks", "0.6",
     "INFO 10-15 09:13:00 gpu_executor.py:122] # GPU blocks: 4468, # CPU blocks: 2048",
     KvCacheBlocks("GPU", 4468, 2048)),
    ("kv_cache_blocks", "0.6",
     "INFO 02-10 11:22:33 executor_base.py:110] # xpu blocks: 2730, # CPU blocks: 4096",
     KvCacheBlocks("xpu", 2730, 4096)),
    ("kv_cache_blocks", "0.8",
     "INFO 04-07 05:28:10 [executor_base.py:111] # xpu blocks: 8192, # CPU blocks: 2048",
     KvCacheBlocks("xpu", 8192, 2048)),
    # --- --max-model-len auto: the context fitted to the KV cache (0.14+) ---------------------
    ("auto_fit_reduced", "0.10.2",  # 0.14-0.15: coloured EngineCore_DP0, 'GPU memory', format_gib
     "\x1b[0;36m(EngineCore_DP0 pid=3052)\x1b[0;0m INFO 01-20 09:15:02 [kv_cache_utils.py:1443] Auto-fit "
     "max_model_len: reduced from 40960 to 18176 to fit in available GPU memory (2.5 GiB available for KV "
     "cache)",
     MaxModelLenAutoFit(requested_max_model_len=40960, max_model_len=18176, available_bytes=gib(2.5))),
    ("auto_fit_reduced", "0.18",  # 0.18-0.30
     "(EngineCore pid=3310) INFO 08-11 13:56:14 [v1/core/kv_cache_utils.py:2567] Auto-fit max_model_len: "
     "reduced from 131072 to 46528 to fit in available GPU memory (2.13 GiB available for KV cache)",
     MaxModelLenAutoFit(requested_max_model_len=131072, max_model_len=46528, available_bytes=gib(2.13))),
    ("auto_fit_reduced", "0.31",  # 0.33: kv_cache_planning.py, the device named
     "(EngineCore pid=1234) INFO 07-02 11:01:00 [kv_cache_planning.py:1405] Auto-fit max_model_len: "
     "reduced from 131072 to 46528 to fit in available KV cache memory (2.13 GiB XPU)",
     MaxModelLenAutoFit(requested_max_model_len=131072, max_model_len=46528, available_bytes=gib(2.13))),
    ("auto_fit_reduced_034", "0.31",
     "(EngineCore pid=1234) INFO 07-02 11:01:00 [kv_cache_planning.py:1494] --max-model-len auto reduced "
     "max_model_len from 131072 to 46528 (2.13 GiB XPU available for the KV cache).",
     MaxModelLenAutoFit(requested_max_model_len=131072, max_model_len=46528, available_bytes=gib(2.13))),
    ("auto_fit_reduced_034", "0.31",  # below 8192 tokens: a WARNING with advice
     "(EngineCore pid=1234) WARNING 07-02 11:01:00 [kv_cache_planning.py:1505] --max-model-len auto "
     "reduced max_model_len from 40960 to 4096 (0.5 GiB XPU available for the KV cache). Requests longer "
     "than 4096 tokens will be rejected. Increase `gpu_memory_utilization` or set --max-model-len "
     "explicitly.",
     MaxModelLenAutoFit(requested_max_model_len=40960, max_model_len=4096, available_bytes=gib(0.5))),
    ("auto_fit_full_length", "0.18",
     "(EngineCore pid=3310) INFO 08-11 13:56:14 [kv_cache_utils.py:2559] Auto-fit max_model_len: full "
     "model context length 40960 fits in available GPU memory",
     MaxModelLenAutoFit(requested_max_model_len=40960, max_model_len=40960)),
    ("auto_fit_full_length", "0.31",
     "(EngineCore pid=1234) INFO 07-02 11:01:00 [kv_cache_planning.py:1467] Auto-fit max_model_len: full "
     "model context length 40960 fits in available KV cache memory (7.25 GiB XPU)",
     MaxModelLenAutoFit(requested_max_model_len=40960, max_model_len=40960, available_bytes=gib(7.25))),
    ("auto_fit_attention_free", "0.18",
     "(EngineCore pid=3310) INFO 08-11 13:56:14 [kv_cache_utils.py:2533] Auto-fit max_model_len: "
     "attention-free model, using derived max_model_len=2048",
     MaxModelLenAutoFit(requested_max_model_len=2048, max_model_len=2048)),
    # --- vLLM's own startup plan (0.34, VLLM_ENABLE_STARTUP_PLAN=1) ------------------------------
    ("startup_plan_applied", "0.31",
     "(EngineCore pid=1234) INFO 07-02 11:00:41 [startup_plan.py:212] Applying persisted startup plan "
     "(fingerprint 3f9a2c41d0b7e6a5): kv_cache_memory_bytes=5368709120 (5.00 GiB), recorded free-memory "
     "baseline 14.21 GiB, current 14.85 GiB. Memory profiling will be skipped.",
     StartupPlan(StartupPlanOutcome.APPLIED, kv_cache_memory_bytes=5368709120)),
    ("startup_plan_fallback", "0.31",
     "(EngineCore pid=1234) INFO 07-02 11:00:41 [startup_plan.py:198] Startup plan not applied: current "
     "free memory (9.63 GiB) is below the recorded baseline (14.21 GiB); falling back to full memory "
     "profiling.",
     StartupPlan(StartupPlanOutcome.FALLBACK, free_bytes=gib(9.63), baseline_free_bytes=gib(14.21))),
    ("startup_plan_saved", "0.31",
     "(EngineCore pid=1234) INFO 07-02 11:01:02 [startup_plan.py:251] Saved startup plan to "
     "/var/cache/vllm/startup_plan/startup_plan_3f9a2c41d0b7e6a5.json",
     StartupPlan(StartupPlanOutcome.SAVED)),
    # --- sleep mode --------------------------------------------------------------------------
    ("sleep_mode_freed", "0.31",
     "(EngineCore pid=1234) INFO 07-02 12:30:05 [gpu_worker.py:142] Sleep mode freed 11.62 GiB memory, "
     "2.41 GiB memory is still in use.",
     SleepFreed(freed_bytes=gib(11.62), device_used_bytes=gib(2.41))),
    ("woke", "0.31",
     "(EngineCore_DP0 pid=1234) INFO 07-02 12:31:40 [abstract.py:330] It took 2.204117 seconds to wake up tags "
     "{'weights', 'kv_cache'}.",
     Woke(wake_seconds=2.204117)),
    # --- init outcome ------------------------------------------------------------------------
    ("init_engine_took", "0.6",
     "INFO 10-15 09:13:07 llm_engine.py:448] init engine (profile, create kv cache, warmup model) "
     "took 6.70 seconds",
     EngineInitDone(6.70)),
    ("init_engine_took", "0.8",
     "INFO 04-07 05:28:11 [llm_engine.py:437] init engine (profile, create kv cache, warmup "
     "model) took 4.31 seconds",
     EngineInitDone(4.31)),
    ("init_engine_took", "0.10.1",
     "(EngineCore_0 pid=207574) INFO 11-06 18:41:10 [core.py:215] init engine (profile, create kv "
     "cache, warmup model) took 1.44 seconds",
     EngineInitDone(1.44)),
    ("init_engine_took", "0.10.2",
     f"{CYAN}(EngineCore_DP0 pid=3052){RESET} INFO 01-15 06:46:20 [core.py:210] init engine "
     "(profile, create kv cache, warmup model) took 32.05 seconds",
     EngineInitDone(32.05)),
    ("init_engine_took", "0.18",
     "(EngineCore pid=3310) INFO 08-11 13:57:00 [v1/engine/core.py:283] init engine (profile, "
     "create kv cache, warmup model) took 45.12 s (compilation: 20.31 s)",
     EngineInitDone(45.12, 20.31)),
    ("init_engine_took", "0.18",
     "(EngineCore pid=3310) INFO 08-11 13:57:00 [core.py:283] init engine (profile, create kv "
     "cache, warmup model) took 61.40 s (compilation: 30.20 s — language_model: 25.10 s, "
     "encoder: 5.10 s)",
     EngineInitDone(61.40, 30.20)),
    ("init_engine_took", "0.31",
     "(EngineCore pid=1234) INFO 07-02 11:01:03 [core.py:301] init engine (profile, create kv "
     "cache, warmup model) took 3.10 s",
     EngineInitDone(3.10)),
    ("application_startup_complete", "0.6",
     "INFO:     Application startup complete.",
     ServerReady()),
    ("application_startup_complete", "0.10.1",
     "(APIServer pid=206609) INFO:     Application startup complete.",
     ServerReady()),
    # --- kv_cache_too_small ------------------------------------------------------------------
    ("kv_too_small_v1", "raw",  # the problem statement's line: balanced parenthesis
     "ValueError: To serve at least one request with the model's max seq len (131072), 3.36 GiB KV "
     "cache is needed, which is larger than the available KV cache memory (2.13 GiB). Based on the "
     "available memory, the estimated maximum model length is 46528.",
     FailureCause(R.KV_CACHE_TOO_SMALL, max_model_len=131072, needed_bytes=gib(3.36),
                  available_bytes=gib(2.13), estimated_max_model_len=46528)),
    ("kv_too_small_v1", "0.6",  # 0.7.0: "models's", "GB", unbalanced "(", no estimate
     "ERROR 02-10 11:22:40 core.py:210] ValueError: To serve at least one request with the "
     "models's max seq len (32768), (4.00 GB KV cache is needed, which is larger than the "
     "available KV cache memory (1.50 GB). Try increasing `gpu_memory_utilization` or decreasing "
     "`max_model_len` when initializing the engine.",
     FailureCause(R.KV_CACHE_TOO_SMALL, max_model_len=32768, needed_bytes=gib(4.0),
                  available_bytes=gib(1.5))),
    ("kv_too_small_v1", "0.8",  # 0.8.5-0.9.0: the estimate f-string was lost
     "ERROR 05-01 10:00:00 [core.py:396] ValueError: To serve at least one request with the "
     "models's max seq len (131072), (16.00 GiB KV cache is needed, which is larger than the "
     "available KV cache memory (5.23 GiB). Based on the available memory,  Try increasing "
     "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
     FailureCause(R.KV_CACHE_TOO_SMALL, max_model_len=131072, needed_bytes=gib(16.0),
                  available_bytes=gib(5.23))),
    ("kv_too_small_v1", "0.10.1",
     "(EngineCore_0 pid=207574) ERROR 11-06 18:41:10 [core.py:700] ValueError: To serve at least "
     "one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, which is "
     "larger than the available KV cache memory (5.23 GiB). Based on the available memory, the "
     "estimated maximum model length is 42848. Try increasing `gpu_memory_utilization` or "
     "decreasing `max_model_len` when initializing the engine.",
     FailureCause(R.KV_CACHE_TOO_SMALL, max_model_len=131072, needed_bytes=gib(16.0),
                  available_bytes=gib(5.23), estimated_max_model_len=42848)),
    ("kv_too_small_v1", "0.10.2",
     f"{CYAN}(EngineCore_DP0 pid=3052){RESET} ERROR 01-15 06:46:16 [core.py:866] ValueError: To "
     "serve at least one request with the models's max seq len (131072), (16.0 GiB KV cache is "
     "needed, which is larger than the available KV cache memory (5.23 GiB). Based on the "
     "available memory, the estimated maximum model length is 42848. Try increasing "
     "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine. See "
     "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
     FailureCause(R.KV_CACHE_TOO_SMALL, max_model_len=131072, needed_bytes=gib(16.0),
                  available_bytes=gib(5.23), estimated_max_model_len=42848)),
    ("kv_too_small_v1", "0.18",
     "(EngineCore pid=3310) ERROR 08-11 13:56:14 [v1/engine/core.py:1195] ValueError: To serve at "
     "least one request with the model's max seq len (40960), (5.62 GiB KV cache is needed, which "
     "is larger than the available KV cache memory (2.5 GiB). Based on the available memory, the "
     "estimated maximum model length is 18176. Try increasing `gpu_memory_utilization` (which "
     "also controls CPU memory on the CPU backend) or decreasing `max_model_len` when "
     "initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ "
     "for more details.",
     FailureCause(R.KV_CACHE_TOO_SMALL, max_model_len=40960, needed_bytes=gib(5.62),
                  available_bytes=gib(2.5), estimated_max_model_len=18176)),
    ("kv_too_small_v1", "0.31",
     "(EngineCore pid=1234) ERROR 07-02 11:01:00 [core.py:1201] ValueError: To serve at least one "
     "request with the model's max seq len (131072), (3.36 GiB KV cache is needed, which is larger "
     "than the available KV cache memory (2.13 GiB). Based on the available memory, the estimated "
     "maximum model length is 46528. Try increasing `gpu_memory_utilization` when initializing the "
     "engine (this flag also controls CPU memory reservation on the CPU backend, despite its "
     "name). Decreasing `max_model_len` also reduces what is needed. See "
     "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
     FailureCause(R.KV_CACHE_TOO_SMALL, max_model_len=131072, needed_bytes=gib(3.36),
                  available_bytes=gib(2.13), estimated_max_model_len=46528)),
    ("kv_too_small_v1", "raw",  # 0.10.2-0.30 multiprocessing copy; negative availability
     "(EngineCore_DP0 pid=3052) ValueError: To serve at least one request with the model's max "
     "seq len (8192), (1.0 GiB KV cache is needed, which is larger than the available KV cache "
     "memory (-0.25 GiB). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
     "when initializing the engine.",
     FailureCause(R.KV_CACHE_TOO_SMALL, max_model_len=8192, needed_bytes=gib(1.0),
                  available_bytes=-gib(0.25))),
    ("kv_too_small_v0", "0.6",
     "ERROR 10-15 09:13:00 engine.py:160] The model's max seq len (32768) is larger than the "
     "maximum number of tokens that can be stored in KV cache (21456). Try increasing "
     "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
     FailureCause(R.KV_CACHE_TOO_SMALL, max_model_len=32768, kv_cache_tokens=21456)),
    ("kv_too_small_v0", "0.8",
     "ERROR 04-07 05:28:10 [engine.py:448] The model's max seq len (131072) is larger than the "
     "maximum number of tokens that can be stored in KV cache (65536). Try increasing "
     "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
     FailureCause(R.KV_CACHE_TOO_SMALL, max_model_len=131072, kv_cache_tokens=65536)),
    ("kv_too_small_v0", "raw",
     "ValueError: The model's max seq len (131072) is larger than the maximum number of tokens "
     "that can be stored in KV cache (65536). Try increasing `gpu_memory_utilization` or "
     "decreasing `max_model_len` when initializing the engine.",
     FailureCause(R.KV_CACHE_TOO_SMALL, max_model_len=131072, kv_cache_tokens=65536)),
    # --- no_kv_cache_memory ------------------------------------------------------------------
    ("no_kv_cache_memory", "0.6",
     "ERROR 11-22 10:00:00 engine.py:366] No available memory for the cache blocks. Try "
     "increasing `gpu_memory_utilization` when initializing the engine.",
     FailureCause(R.NO_KV_CACHE_MEMORY)),
    ("no_kv_cache_memory", "0.8",
     "ERROR 05-01 10:00:00 [core.py:396] ValueError: No available memory for the cache blocks. "
     "Try increasing `gpu_memory_utilization` when initializing the engine.",
     FailureCause(R.NO_KV_CACHE_MEMORY)),
    ("no_kv_cache_memory", "0.10.2",
     f"{CYAN}(EngineCore_DP0 pid=223840){RESET} ERROR 10-25 13:08:43 [core.py:708] ValueError: No "
     "available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
     "initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ "
     "for more details.",
     FailureCause(R.NO_KV_CACHE_MEMORY)),
    ("no_kv_cache_memory", "0.18",
     "(EngineCore pid=3310) ERROR 08-11 13:56:14 [core.py:1195] ValueError: No available memory "
     "for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine "
     "(this flag also controls CPU memory reservation on the CPU backend, despite its name). See "
     "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
     FailureCause(R.NO_KV_CACHE_MEMORY)),
    ("no_kv_cache_memory", "raw",
     "ValueError: No available memory for the cache blocks. Try increasing "
     "`gpu_memory_utilization` when initializing the engine (this flag also controls CPU memory "
     "reservation on the CPU backend, despite its name). See "
     "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
     FailureCause(R.NO_KV_CACHE_MEMORY)),
    ("auto_fit_no_memory", "0.10.2",  # 0.14-0.33 text
     "\x1b[0;36m(EngineCore_DP0 pid=3052)\x1b[0;0m ERROR 01-20 09:15:02 [core.py:946] ValueError: Cannot "
     "auto-fit max_model_len: not enough GPU memory available to serve even a single token. Try "
     "increasing `gpu_memory_utilization`.",
     FailureCause(R.NO_KV_CACHE_MEMORY)),
    ("auto_fit_no_memory", "raw",  # 0.34: the hint of "No available memory for the cache blocks"
     "ValueError: Cannot auto-fit max_model_len: not enough GPU memory available to serve even a single "
     "token. Try increasing `gpu_memory_utilization` when initializing the engine (this flag also "
     "controls CPU memory reservation on the CPU backend, despite its name).",
     FailureCause(R.NO_KV_CACHE_MEMORY)),
    # --- insufficient_free_memory ------------------------------------------------------------
    ("insufficient_free_memory", "0.10.1",
     "(EngineCore_0 pid=207574) ERROR 11-06 18:41:05 [core.py:700] ValueError: Free memory on "
     "device (5.2/23.64 GiB) on startup is less than desired GPU memory utilization (0.9, "
     "21.28 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
     FailureCause(R.INSUFFICIENT_FREE_MEMORY, free_bytes=gib(5.2), total_bytes=gib(23.64),
                  gpu_memory_utilization=0.9, requested_bytes=gib(21.28))),
    ("insufficient_free_memory", "0.10.2",
     "(EngineCore_DP0 pid=4410) ERROR 03-02 09:15:00 [core.py:946] ValueError: Free memory on "
     "device xpu:0 (3.1/23.86 GiB) on startup is less than desired GPU memory utilization (0.5, "
     "11.93 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
     FailureCause(R.INSUFFICIENT_FREE_MEMORY, free_bytes=gib(3.1), total_bytes=gib(23.86),
                  gpu_memory_utilization=0.5, requested_bytes=gib(11.93), device="xpu:0")),
    ("insufficient_free_memory", "0.18",
     "(EngineCore pid=3310) ERROR 08-11 13:56:14 [v1/engine/core.py:1195] ValueError: Free memory "
     "on device cuda:0 (0.41/79.18 GiB) on startup is less than desired GPU memory utilization "
     "(0.85, 67.3 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
     "processes.",
     FailureCause(R.INSUFFICIENT_FREE_MEMORY, free_bytes=gib(0.41), total_bytes=gib(79.18),
                  gpu_memory_utilization=0.85, requested_bytes=gib(67.3), device="cuda:0")),
    ("insufficient_free_memory", "raw",  # vllm#49482: the driver reports free = 0
     "ValueError: Free memory on device xpu:0 (0.0/22.71 GiB) is less than desired GPU memory "
     "utilization (0.9, 20.44 GiB). Decrease GPU memory utilization or reduce GPU memory used by "
     "other processes.",
     FailureCause(R.INSUFFICIENT_FREE_MEMORY, free_bytes=0, total_bytes=gib(22.71),
                  gpu_memory_utilization=0.9, requested_bytes=gib(20.44), device="xpu:0")),
    ("insufficient_free_memory", "0.31",
     "(EngineCore pid=1234) ERROR 07-02 11:00:30 [core.py:1201] ValueError: Free memory on device "
     "xpu:0 (6.0/23.86 GiB) on startup is less than the engine's budget after excluding external "
     "process's weights (0.5, 8.2 GiB). Decrease GPU memory utilization or reduce GPU memory used "
     "by other processes.",
     FailureCause(R.INSUFFICIENT_FREE_MEMORY, free_bytes=gib(6.0), total_bytes=gib(23.86),
                  gpu_memory_utilization=0.5, requested_bytes=gib(8.2), device="xpu:0")),
    ("external_weights_exceed_utilization", "0.31",
     "(EngineCore pid=1234) ERROR 07-02 11:00:30 [core.py:1201] ValueError: Externally held "
     "weights on device xpu:0 (14.2 GiB) exceed the desired GPU memory utilization (0.5, "
     "11.93 GiB).",
     FailureCause(R.INSUFFICIENT_FREE_MEMORY)),
    # --- device_out_of_memory ----------------------------------------------------------------
    ("xpu_out_of_memory", "0.18",
     "(EngineCore pid=3310) ERROR 08-11 13:56:14 [core.py:1195] torch.OutOfMemoryError: XPU out of "
     "memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.86 GiB of which 1.02 GiB "
     "is free. Of the allocated memory 20.50 GiB is allocated by PyTorch, and 200.00 MiB is "
     "reserved by PyTorch but unallocated. Please use `empty_cache` to release all unoccupied "
     "cached memory.",
     FailureCause(R.DEVICE_OUT_OF_MEMORY, requested_bytes=gib(2.0), total_bytes=gib(23.86),
                  free_bytes=gib(1.02))),
    ("xpu_out_of_memory", "raw",
     "torch.OutOfMemoryError: XPU out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total "
     "capacity of 15.11 GiB of which 300.00 MiB is free. 14.50 GiB allowed; Of the allocated "
     "memory 13.90 GiB is allocated by PyTorch, and 100.00 MiB is reserved by PyTorch but "
     "unallocated. Please use `empty_cache` to release all unoccupied cached memory.",
     FailureCause(R.DEVICE_OUT_OF_MEMORY, requested_bytes=mib(512.0), total_bytes=gib(15.11),
                  free_bytes=mib(300.0))),
    ("ur_out_of_device_memory", "0.10.2",
     f"{CYAN}(EngineCore_DP0 pid=3052){RESET} ERROR 01-15 06:46:16 [core.py:866] RuntimeError: "
     "Native API failed. Native API returns: 39 (UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)",
     FailureCause(R.DEVICE_OUT_OF_MEMORY)),
    ("ur_out_of_device_memory", "raw",
     "RuntimeError: level_zero backend failed with error: 39 (UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)",
     FailureCause(R.DEVICE_OUT_OF_MEMORY)),
    # --- memory_query_unsupported ------------------------------------------------------------
    ("memory_query_unsupported", "0.8",  # vllm#20743, 0.9.2
     "ERROR 07-11 10:00:00 [core.py:586] RuntimeError: The device (Intel(R) Arc(TM) 140T GPU "
     "(16GB)) doesn't support querying the available free memory. You can file an issue at "
     "https://github.com/pytorch/pytorch/issues to help us prioritize its implementation.",
     FailureCause(R.MEMORY_QUERY_UNSUPPORTED, device="Intel(R) Arc(TM) 140T GPU (16GB)")),
    ("memory_query_unsupported", "raw",
     "RuntimeError: The device (Intel(R) Arc(TM) B580 Graphics) doesn't support querying the "
     "available free memory. You can file an issue at https://github.com/pytorch/pytorch/issues "
     "to help us prioritize its implementation.",
     FailureCause(R.MEMORY_QUERY_UNSUPPORTED, device="Intel(R) Arc(TM) B580 Graphics")),
    # --- wrappers ----------------------------------------------------------------------------
    ("engine_core_failed_to_start", "0.8",
     "ERROR 05-01 10:00:00 [core.py:396] EngineCore failed to start.",
     FailureWrapper(WrapperKind.ENGINE_CORE_FAILED_TO_START)),
    ("engine_core_failed_to_start", "0.10.2",
     f"{CYAN}(EngineCore_DP0 pid=223840){RESET} ERROR 10-25 13:08:43 [core.py:708] EngineCore "
     "failed to start.",
     FailureWrapper(WrapperKind.ENGINE_CORE_FAILED_TO_START)),
    ("engine_core_failed_to_start", "0.31",
     "(EngineCore pid=1234) ERROR 07-02 11:01:00 [core.py:1201] EngineCore failed to start.",
     FailureWrapper(WrapperKind.ENGINE_CORE_FAILED_TO_START)),
    ("engine_core_hit_exception", "0.6",
     "ERROR 02-10 11:22:40 core.py:210] EngineCore hit an exception: Traceback (most recent call "
     "last):",
     FailureWrapper(WrapperKind.ENGINE_CORE_HIT_EXCEPTION)),
    ("engine_core_init_failed", "raw",  # 0.8.5
     "RuntimeError: Engine core initialization failed. See root cause above.",
     FailureWrapper(WrapperKind.ENGINE_CORE_INIT_FAILED)),
    ("engine_core_init_failed", "0.10.1",
     "(APIServer pid=206609) RuntimeError: Engine core initialization failed. See root cause "
     "above. Failed core proc(s): {'EngineCore_0': 1}",
     FailureWrapper(WrapperKind.ENGINE_CORE_INIT_FAILED)),
    ("engine_core_init_failed", "0.31",
     "RuntimeError: Engine core initialization failed. See root cause above. Failed core "
     "proc(s): {}, failed frontend proc(s): {}",
     FailureWrapper(WrapperKind.ENGINE_CORE_INIT_FAILED)),
    ("engine_core_proc_init_failed", "raw",
     "RuntimeError: EngineCore initialization failed. See root cause above.",
     FailureWrapper(WrapperKind.ENGINE_CORE_PROC_INIT_FAILED)),
    ("engine_core_proc_init_failed", "raw",
     "RuntimeError: EngineCore_0 initialization failed. See root cause above.",
     FailureWrapper(WrapperKind.ENGINE_CORE_PROC_INIT_FAILED)),
    ("frontend_init_failed", "raw",
     "RuntimeError: Frontend process failed during engine core initialization. See root cause "
     "above. Failed frontend proc(s): {'APIServer_1': 1}",
     FailureWrapper(WrapperKind.FRONTEND_INIT_FAILED)),
    ("engine_process_failed_to_start", "raw",  # 0.6.3
     "RuntimeError: Engine process failed to start",
     FailureWrapper(WrapperKind.ENGINE_PROCESS_FAILED_TO_START)),
    ("engine_process_failed_to_start", "raw",  # 0.6.4-0.10
     "RuntimeError: Engine process failed to start. See stack trace for the root cause.",
     FailureWrapper(WrapperKind.ENGINE_PROCESS_FAILED_TO_START)),
]
# fmt: on


def _exact_line_params() -> list[object]:
    return [
        pytest.param(line, expected, id=f"{row}-{era}-{index}")
        for index, (row, era, line, expected) in enumerate(EXACT_LINES)
    ]


@pytest.mark.parametrize(("line", "expected"), _exact_line_params())
def test_exact_line_parses_to_expected_event(line: str, expected: object) -> None:
    assert parse_line(line) == expected


@pytest.mark.parametrize(
    ("row_name", "line"),
    [pytest.param(row, line, id=f"{row}-{i}") for i, (row, _, line, _) in enumerate(EXACT_LINES)],
)
def test_exact_line_is_matched_by_the_row_it_documents(row_name: str, line: str) -> None:
    row = next(row for row in GRAMMAR if row.name == row_name)
    text = normalise(line)
    matched = row.pattern.search(text) if row.anywhere else row.pattern.match(text)
    assert matched is not None


def test_every_grammar_row_has_an_exact_line() -> None:
    documented = {row for row, _, _, _ in EXACT_LINES}
    assert {row.name for row in GRAMMAR} <= documented


def test_every_format_era_has_exact_lines() -> None:
    eras = {era for _, era, _, _ in EXACT_LINES}
    assert eras == {"0.6", "0.8", "0.10.1", "0.10.2", "0.18", "0.31", "raw"}


# Each message wrapped in every era's envelope parses the same as the bare message.
ENVELOPES = {
    "0.6-no-brackets": "{level} 05-12 10:11:12 gpu_executor.py:122] {msg}",
    "0.8-brackets": "{level} 05-12 10:11:12 [gpu_worker.py:232] {msg}",
    "0.10.1-EngineCore_0": "(EngineCore_0 pid=207574) {level} 11-06 18:41:10 [core.py:215] {msg}",
    "0.10.2-EngineCore_DP0-ansi": (
        "\x1b[1;36m(EngineCore_DP0 pid=3052)\x1b[0;0m {level} 01-15 06:46:16 [core.py:1286] {msg}"
    ),
    "0.18-EngineCore-relpath": "(EngineCore pid=3310) {level} 08-11 13:56:14 [v1/engine/core.py:1195] {msg}",
    "0.31-APIServer": "(APIServer pid=1) {level} 05-12 10:11:12 [api_server.py:796] {msg}",
    "raw-prefixed": "(EngineCore_DP0 pid=3052) {msg}",
    "raw-indented": "    {msg}",
}
# fmt: off
BARE_MESSAGES = [
    ("INFO", "vLLM API server version 0.9.2"),
    ("INFO", "Available KV cache memory: 7.25 GiB"),
    ("INFO", "XPU KV cache size: 54,880 tokens, Maximum concurrency for 8,192 tokens per request: 6.70x"),
    ("INFO", "# xpu blocks: 2730, # CPU blocks: 4096"),
    ("INFO", "init engine (profile, create kv cache, warmup model) took 45.12 s (compilation: 20.31 s)"),
    ("ERROR", "ValueError: No available memory for the cache blocks. Try increasing "
              "`gpu_memory_utilization` when initializing the engine."),
    ("ERROR", "ValueError: Free memory on device xpu:0 (3.1/23.86 GiB) on startup is less than "
              "desired GPU memory utilization (0.5, 11.93 GiB)."),
    ("ERROR", "torch.OutOfMemoryError: XPU out of memory. Tried to allocate 2.00 GiB."),
    ("ERROR", "RuntimeError: Engine core initialization failed. See root cause above. Failed core "
              "proc(s): {'EngineCore_DP0': 1}"),
]
# fmt: on


@pytest.mark.parametrize("envelope", list(ENVELOPES.values()), ids=list(ENVELOPES))
@pytest.mark.parametrize(("level", "message"), BARE_MESSAGES, ids=[m[:30] for _, m in BARE_MESSAGES])
def test_envelope_of_every_era_parses_like_the_bare_message(
    envelope: str, level: str, message: str
) -> None:
    bare = parse_line(message)
    assert bare is not None
    assert parse_line(envelope.format(level=level, msg=message)) == bare


def test_root_cause_logged_then_copied_raw_parses_to_equal_events() -> None:
    logged = (
        "(EngineCore_DP0 pid=223840) ERROR 10-25 13:08:43 [core.py:708] ValueError: To serve at "
        "least one request with the model's max seq len (131072), (3.36 GiB KV cache is needed, "
        "which is larger than the available KV cache memory (2.13 GiB). Try increasing "
        "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
    )
    raw_copy = (
        "(EngineCore_DP0 pid=223840) ValueError: To serve at least one request with the model's max "
        "seq len (131072), (3.36 GiB KV cache is needed, which is larger than the available KV cache "
        "memory (2.13 GiB). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
        "when initializing the engine."
    )
    first, second = parse_line(logged), parse_line(raw_copy)
    assert isinstance(first, FailureCause)
    assert first == second
    assert hash(first) == hash(second)


def test_v0_exception_text_header_and_traceback_tail_parse_to_equal_events() -> None:
    header_copy = (
        "ERROR 11-22 10:00:00 engine.py:366] No available memory for the cache blocks. Try "
        "increasing `gpu_memory_utilization` when initializing the engine."
    )
    traceback_tail = (
        "ERROR 11-22 10:00:00 engine.py:366] ValueError: No available memory for the cache blocks. "
        "Try increasing `gpu_memory_utilization` when initializing the engine."
    )
    assert parse_line(header_copy) == parse_line(traceback_tail) == FailureCause(
        FailureReason.NO_KV_CACHE_MEMORY
    )


@pytest.mark.parametrize(
    ("kind", "terminal"),
    [
        (WrapperKind.ENGINE_CORE_FAILED_TO_START, False),
        (WrapperKind.ENGINE_CORE_HIT_EXCEPTION, False),
        (WrapperKind.ENGINE_CORE_INIT_FAILED, True),
        (WrapperKind.ENGINE_CORE_PROC_INIT_FAILED, True),
        (WrapperKind.FRONTEND_INIT_FAILED, True),
        (WrapperKind.ENGINE_PROCESS_FAILED_TO_START, True),
    ],
)
def test_only_front_end_wrappers_end_a_failed_start(kind: WrapperKind, terminal: bool) -> None:
    assert FailureWrapper(kind).terminal is terminal


def test_failure_reason_values_are_the_contract_labels() -> None:
    assert {reason.value for reason in FailureReason} == {
        "kv_cache_too_small",
        "no_kv_cache_memory",
        "insufficient_free_memory",
        "device_out_of_memory",
        "memory_query_unsupported",
        "other",
    }


NOISE_LINES = [
    'INFO:     127.0.0.1:34658 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    '(APIServer pid=1) INFO:     10.0.0.7:51234 - "GET /metrics HTTP/1.1" 200 OK',
    "(APIServer pid=1) INFO 05-12 10:11:12 [loggers.py:123] Engine 000: Avg prompt throughput: "
    "12.3 tokens/s, Avg generation throughput: 45.6 tokens/s, Running: 1 reqs, Waiting: 0 reqs, "
    "GPU KV cache usage: 1.2%, Prefix cache hit rate: 0.0%",
    "INFO 05-12 10:11:12 metrics.py:351] Avg prompt throughput: 0.0 tokens/s, Avg generation "
    "throughput: 0.0 tokens/s, Running: 0 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache "
    "usage: 0.0%, CPU KV cache usage: 0.0%.",
    # The failure text quoted inside a request log is not a failure.
    "(APIServer pid=1) INFO 05-12 10:11:12 [logger.py:39] Received request cmpl-1: prompt: "
    "'Explain: To serve at least one request with the model's max seq len (131072), (3.36 GiB KV "
    "cache is needed, which is larger than the available KV cache memory (2.13 GiB).', params: "
    "SamplingParams(n=1, temperature=0.7)",
    "(EngineCore_DP0 pid=223840) ERROR 10-25 13:08:43 [core.py:708] Traceback (most recent call last):",
    '(EngineCore_DP0 pid=223840) ERROR 10-25 13:08:43 [core.py:708]   File "/usr/lib/python3.12/'
    'site-packages/vllm/v1/engine/core.py", line 83, in __init__',
    # Source lines echoed in traceback frames.
    '(EngineCore_DP0 pid=223840) ERROR 10-25 13:08:43 [core.py:708]     raise ValueError("No '
    'available memory for the cache blocks. "',
    '            f"To serve at least one request with the model\'s max seq len "',
    '    raise RuntimeError("Engine process failed to start. See stack trace for the root cause.")',
    "    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    "Process EngineCore_DP0:",
    "The above exception was the direct cause of the following exception:",
    "(EngineCore_0 pid=207574)",
    "(APIServer pid=1) INFO 04-19 10:51:55 [utils.py:299]        █     █     █▄   ▄█",
    "(APIServer pid=1) INFO 04-19 10:51:55 [utils.py:299]    ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀",
    "(APIServer pid=206609) INFO 11-06 18:41:10 [loggers.py:142] Engine 000: vllm cache_config_info "
    "with initialization after num_gpu_blocks is: 1419",
    "(APIServer pid=206609) INFO 11-06 18:40:53 [__init__.py:1786] Using max model len 4096",
    "Loading safetensors checkpoint shards: 100% Completed | 2/2 [00:04<00:00,  2.05s/it]",
    "(EngineCore pid=1234) ERROR 07-02 11:05:00 [core.py:1000] EngineCore encountered a fatal error.",
    "INFO 10-15 09:13:00 worker.py:232] Memory profiling takes 2.31 seconds",
    "2025:11:06-18:41:03:(207574) |CCL_WARN| value of CCL_ATL_TRANSPORT changed to be ofi (default:mpi)",
    "# comment in a unit file",
    "",
    "   ",
]


@pytest.mark.parametrize("line", NOISE_LINES, ids=[f"noise-{i}" for i in range(len(NOISE_LINES))])
def test_line_that_means_nothing_parses_to_none(line: str) -> None:
    assert parse_line(line) is None


SIXTY_KIB = 60 * 1024
HOSTILE_LINES = {
    "plain-60k": "a" * SIXTY_KIB,
    "open-parens-60k": "(" * SIXTY_KIB,
    "unclosed-header-60k": "INFO 05-12 10:11:12 [" + "a" * SIXTY_KIB,
    "ansi-fragments-60k": "\x1b[" * (SIXTY_KIB // 2),
    "replacement-chars-60k": "\ufffd" * SIXTY_KIB,
    "binary-junk": bytes(range(256)).decode("utf-8", "replace") * 240,
    "nuls": "\x00" * SIXTY_KIB,
    "kv-too-small-with-60k-digits": (
        "To serve at least one request with the model's max seq len (" + "1" * SIXTY_KIB
    ),
    "free-memory-with-60k-parens": "Free memory on device " + "(" * SIXTY_KIB,
    "available-kv-with-60k-digits": "Available KV cache memory: " + "9" * SIXTY_KIB + " GiB",
    "device-name-60k": "The device (" + "x" * SIXTY_KIB,
    "engine-config-60k-model": (
        "Initializing a V1 LLM engine (v0.1) with config: model='" + "a" * SIXTY_KIB
    ),
    "non-default-args-unclosed": "non-default args: {" + "'x': [" * (SIXTY_KIB // 6),
    "non-default-args-deeply-nested": "non-default args: " + "{'a': " * 5000 + "1" + "}" * 5000,
    "namespace-repeated-keys": "args: Namespace(" + "model=" * (SIXTY_KIB // 6) + ")",
    "banner-60k": "█" * SIXTY_KIB + " version 1",
    "process-prefix-60k": "(" + "A" * SIXTY_KIB + " pid=1) x",
    "exception-class-60k": "A" * SIXTY_KIB + "Error: x",
}


@pytest.mark.parametrize("line", list(HOSTILE_LINES.values()), ids=list(HOSTILE_LINES))
def test_hostile_line_returns_without_raising_or_hanging(line: str) -> None:
    started = time.perf_counter()
    parse_line(line)
    # A hang detector, not a speed target (benchmarks/catchup_bench.py measures the grammar's speed):
    # catastrophic backtracking on a 60 KiB line takes minutes, far past this on any machine.
    assert time.perf_counter() - started < 2.0


def test_non_default_args_longer_than_the_cap_still_yield_the_leading_settings() -> None:
    line = (
        "(APIServer pid=1) INFO 04-03 15:05:37 [utils.py:233] non-default args: {'model': "
        "'Qwen/Qwen3-0.6B', 'gpu_memory_utilization': 0.3, 'chat_template': '"
        + "x" * (MAX_LINE_CHARS + 10_000)
        + "'}"
    )
    assert parse_line(line) == Settings(
        NON_DEFAULT, model="Qwen/Qwen3-0.6B", gpu_memory_utilization=0.3
    )


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=3000))
def test_arbitrary_text_never_raises(text: str) -> None:
    parse_line(text)


ANCHORS = sorted({anchor for row in GRAMMAR for anchor in row.anchors})


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(ANCHORS), st.text(max_size=500))
def test_text_after_a_template_anchor_never_raises(anchor: str, tail: str) -> None:
    parse_line("ERROR 05-12 10:11:12 [core.py:1] " + anchor + tail)


# --- helpers for the reducer --------------------------------------------------------------------


def test_kv_bytes_from_real_xpu_profiling_lines_match_the_blocks_vllm_allocated() -> None:
    # vLLM 0.10.1 on one Aurora tile, Llama-2-7b fp16 (512 KiB of KV per token), block size 64:
    # "total GPU memory: 65520.00 MB", "peak memory usage is 13552.69 MB", default util 0.9, and
    # vLLM reported 1419 blocks / "GPU KV cache size: 90,816 tokens".
    before = parse_line(
        "(EngineCore_0 pid=207574) INFO 11-06 18:41:09 [xpu_worker.py:104] Before memory profiling "
        "run, total GPU memory: 65520.00 MB, model load takes 12870.74 MB, free gpu memory is "
        "52435.44 MB."
    )
    after = parse_line(
        "(EngineCore_0 pid=207574) INFO 11-06 18:41:10 [xpu_worker.py:139] After memory profiling "
        "run, peak memory usage is 13552.69 MB,torch mem is 12870.74 MB, non-torch mem is 426.94 "
        "MB, free gpu memory is 51896.32 MB."
    )
    assert isinstance(before, ProfilingBefore) and isinstance(after, ProfilingAfter)
    kv_bytes = kv_cache_bytes_from_profiling(before.total_bytes, 0.9, after.peak_bytes)
    assert kv_bytes == 47_621_404_099
    bytes_per_block = 512 * 1024 * 64
    assert kv_bytes // bytes_per_block == 1419
    assert kv_bytes // bytes_per_block * 64 == 90_816


def test_kv_bytes_from_profiling_is_negative_when_peak_exceeds_the_budget() -> None:
    assert kv_cache_bytes_from_profiling(16 * GiB, 0.5, 9 * GiB) == -1 * GiB


@pytest.mark.parametrize(
    ("version", "default"),
    [
        ("0.6.3.post1", 0.9),
        ("0.10.1rc2.dev189+ge2db1164a", 0.9),
        ("0.19.1", 0.9),
        ("0.20.0", 0.92),
        ("v0.22.1rc1.dev26+g4721bb3aa", 0.92),
        ("0.34.0", 0.92),
        ("unknown", None),
    ],
)
def test_default_gpu_memory_utilization_follows_the_release(
    version: str, default: float | None
) -> None:
    assert default_gpu_memory_utilization(version) == default


# --- implausible values -------------------------------------------------------------------------

API = "(APIServer pid=1) INFO 04-03 15:05:37 [utils.py:233] "

# (line, the row it matches, the field out of range)
HUGE_SETTINGS = {
    # ast.literal_eval reads up to 4,300 digits: a finite int no float (nor the exposition) can hold
    "max-model-len-4000-digits": (API + "non-default args: {'model': 'z', 'max_model_len': " + "9" * 4000 + "}",
                                  "non_default_args", "max_model_len"),
    # past 4,300 digits literal_eval refuses and the per-key reader takes the first 64 digits
    "max-model-len-5000-digits": (API + "non-default args: {'model': 'z', 'max_model_len': " + "9" * 5000 + "}",
                                  "non_default_args", "max_model_len"),
    "namespace-max-model-len-64-digits": ("INFO 10-15 09:12:01 api_server.py:585] args: Namespace(host=None, "
                                          "max_model_len=" + "9" * 64 + ", max_num_seqs=256)",
                                          "args_namespace", "max_model_len"),
    "model-name-with-a-lone-surrogate": (API + "non-default args: {'model': '\\udcff'}",
                                         "non_default_args", "model"),
}


@pytest.mark.parametrize(("line", "row", "field"), list(HUGE_SETTINGS.values()), ids=list(HUGE_SETTINGS))
def test_a_setting_no_exposition_can_carry_makes_the_line_implausible(line: str, row: str, field: str) -> None:
    assert parse_line(line) == ImplausibleValue(row, field)


def test_every_number_of_every_event_has_plausible_bounds() -> None:
    event_types = [EngineConfig, Settings, KvCacheMemory, ProfilingBefore, ProfilingAfter, ModelWeights,
                   MemoryUsage, KvCacheCapacity, KvCacheBlocks, MaxModelLenAutoFit, StartupPlan, SleepFreed, Woke, EngineInitDone, FailureCause]
    numeric = {field.name for cls in event_types for field in dataclasses.fields(cls)
               if {"int", "float"} & set(re.findall(r"\w+", str(field.type)))}
    assert numeric == set(PLAUSIBLE)


CORE = "(EngineCore pid=3310) INFO 08-11 13:56:14 [core.py:1195] "
KV_TOO_SMALL = ("To serve at least one request with the model's max seq len ({len}), ({needed} GiB KV cache is "
                "needed, which is larger than the available KV cache memory ({available} GiB).")
# (line, the row it matches, the field out of range)
ABSURD_VALUES = {
    "utilisation-1e999": (API + "non-default args: {'model': 'z', 'gpu_memory_utilization': 1e999}",
                          "non_default_args", "gpu_memory_utilization"),
    "utilisation-1e308": (API + "non-default args: {'model': 'z', 'gpu_memory_utilization': 1e308}",
                          "non_default_args", "gpu_memory_utilization"),
    "utilisation-negative": (API + "non-default args: {'gpu_memory_utilization': -0.5}",
                             "non_default_args", "gpu_memory_utilization"),
    "utilisation-zero": (API + "non-default args: {'gpu_memory_utilization': 0}",
                         "non_default_args", "gpu_memory_utilization"),
    "utilisation-above-one": ("INFO 10-15 09:12:01 api_server.py:585] args: Namespace(host=None, gpu_memory_utilization=1.5)",
                              "args_namespace", "gpu_memory_utilization"),
    "startup-plan-budget-huge": (CORE + "Applying persisted startup plan (fingerprint ab): "
                                 "kv_cache_memory_bytes=99999999999999999999 (1 GiB), recorded ...",
                                 "startup_plan_applied", "kv_cache_memory_bytes"),
    "sleep-used-negative": (CORE + "Sleep mode freed 1.00 GiB memory, -2.00 GiB memory is still in use.",
                            "sleep_mode_freed", "device_used_bytes"),
    "max-num-seqs-huge": (API + "non-default args: {'max_num_seqs': 100000000000}",
                          "non_default_args", "max_num_seqs"),
    "kv-cache-memory-bytes-2-pib": (API + "non-default args: {'kv_cache_memory_bytes': 2251799813685248}",
                                    "non_default_args", "kv_cache_memory_bytes"),
    "block-size-huge": (API + "non-default args: {'block_size': 2000000}", "non_default_args", "block_size"),
    "available-kv-minus-1.07e24": (CORE + "Available KV cache memory: -999999999999999 GiB",
                                   "available_kv_cache_memory", "kv_cache_bytes"),
    "available-kv-2-pib": (CORE + "Available KV cache memory: 2097152 GiB",
                           "available_kv_cache_memory", "kv_cache_bytes"),
    "reserved-kv-huge": (CORE + "Initial free memory 20.0 GiB, reserved 99999999999 GiB memory for KV Cache as "
                                "specified by kv_cache_memory_bytes config", "kv_cache_memory_bytes_reserved",
                         "kv_cache_bytes"),
    "profiling-total-huge": (CORE + "Before memory profiling run, total GPU memory: 999999999999999 MB, model "
                                    "load takes 8204.13 MB, free gpu memory is 16147.87 MB.",
                             "profiling_before", "total_bytes"),
    "profiling-peak-negative": (CORE + "After memory profiling run, peak memory usage is -9013.40 MB,torch mem is "
                                       "8204.13 MB, non-torch mem is 128.00 MB, free gpu memory is 15338.60 MB.",
                                "profiling_after", "peak_bytes"),
    "kv-tokens-huge": (CORE + "GPU KV cache size: 9,999,999,999,999,999 tokens", "kv_cache_size_tokens", "tokens"),
    "concurrency-negative": (CORE + "Maximum concurrency for 8,192 tokens per request: -3.00x",
                             "max_concurrency", "max_concurrency"),
    "concurrency-for-zero-tokens": (CORE + "Maximum concurrency for 0 tokens per request: 3.00x",
                                    "max_concurrency", "max_model_len"),
    "auto-fit-to-zero-tokens": (CORE + "Auto-fit max_model_len: reduced from 40960 to 0 to fit in available GPU "
                                       "memory (0.0 GiB available for KV cache)", "auto_fit_reduced", "max_model_len"),
    "auto-fit-from-2-pow-50-tokens": (CORE + "--max-model-len auto reduced max_model_len from 1125899906842624 to "
                                             "4096 (0.5 GiB XPU available for the KV cache).",
                                      "auto_fit_reduced_034", "requested_max_model_len"),
    "v0-blocks-negative": ("INFO 10-15 09:13:00 gpu_executor.py:122] # GPU blocks: -5, # CPU blocks: 2048",
                           "kv_cache_blocks", "device_blocks"),
    "init-duration-negative": (CORE + "init engine (profile, create kv cache, warmup model) took -5.00 seconds",
                               "init_engine_took", "duration_seconds"),
    "init-duration-a-year": (CORE + "init engine (profile, create kv cache, warmup model) took 31536000.00 s",
                             "init_engine_took", "duration_seconds"),
    "compilation-negative": (CORE + "init engine (profile, create kv cache, warmup model) took 5.00 s "
                                    "(compilation: -1.00 s)", "init_engine_took", "compilation_seconds"),
    "kv-too-small-needed-1.07e24": (CORE + KV_TOO_SMALL.format(len=131072, needed=999999999999999, available=2.13),
                                    "kv_too_small_v1", "needed_bytes"),
    "kv-too-small-available-minus-1.07e24": (
        CORE + KV_TOO_SMALL.format(len=131072, needed=3.36, available=-999999999999999),
        "kv_too_small_v1", "available_bytes"),
    "kv-too-small-max-model-len-huge": (CORE + KV_TOO_SMALL.format(len="9" * 20, needed=3.36, available=2.13),
                                        "kv_too_small_v1", "max_model_len"),
    "kv-too-small-v0-negative-tokens": ("ERROR 10-15 09:13:00 engine.py:160] The model's max seq len (32768) is "
                                        "larger than the maximum number of tokens that can be stored in KV cache "
                                        "(-21456).", "kv_too_small_v0", "kv_cache_tokens"),
    "insufficient-free-utilisation-7.5": (CORE + "ValueError: Free memory on device xpu:0 (3.1/23.86 GiB) on startup "
                                                 "is less than desired GPU memory utilization (7.5, 11.93 GiB).",
                                          "insufficient_free_memory", "gpu_memory_utilization"),
    "out-of-memory-request-huge": (CORE + "torch.OutOfMemoryError: XPU out of memory. Tried to allocate "
                                          "999999999999999 GiB.", "xpu_out_of_memory", "requested_bytes"),
}


@pytest.mark.parametrize(("line", "row", "field"), list(ABSURD_VALUES.values()), ids=list(ABSURD_VALUES))
def test_an_absurd_value_makes_the_line_implausible(line: str, row: str, field: str) -> None:
    assert parse_line(line) == ImplausibleValue(row, field)


EDGES = {
    "utilisation-one": (API + "non-default args: {'gpu_memory_utilization': 1}",
                        Settings(NON_DEFAULT, gpu_memory_utilization=1.0)),
    "max-model-len-auto-is-not-stated": (API + "non-default args: {'model': 'm', 'max_model_len': -1}",
                                         Settings(NON_DEFAULT, model="m")),
    "available-kv-minus-one-pib": (CORE + "Available KV cache memory: -1048576 GiB",
                                   KvCacheMemory(-(2**50), KvMemorySource.AVAILABLE)),
    "available-kv-one-pib": (CORE + "Available KV cache memory: 1048576 GiB",
                             KvCacheMemory(2**50, KvMemorySource.AVAILABLE)),
    "non-torch-negative": (CORE + "After memory profiling run, peak memory usage is 9013.40 MB,torch mem is "
                                  "8204.13 MB, non-torch mem is -64.00 MB, free gpu memory is 15338.60 MB.",
                           ProfilingAfter(mib(9013.40), mib(8204.13), -mib(64.0), mib(15338.60))),
    "init-duration-zero": (CORE + "init engine (profile, create kv cache, warmup model) took 0.00 seconds",
                           EngineInitDone(0.0)),
    "concurrency-zero": (CORE + "Maximum concurrency for 8,192 tokens per request: 0.00x",
                         KvCacheCapacity(None, 8192, 0.0, None)),
}


@pytest.mark.parametrize(("line", "expected"), list(EDGES.values()), ids=list(EDGES))
def test_values_at_the_edges_of_their_bounds_are_kept(line: str, expected: object) -> None:
    assert parse_line(line) == expected
