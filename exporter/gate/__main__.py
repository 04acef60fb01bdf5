from vllm_xpu_exporter.gate.cli import main

raise SystemExit(main())
