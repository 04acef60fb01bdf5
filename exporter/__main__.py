from vllm_xpu_exporter.cli import main

raise SystemExit(main())
