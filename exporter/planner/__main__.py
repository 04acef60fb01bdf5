from vllm_xpu_exporter.planner.cli import main

raise SystemExit(main())
