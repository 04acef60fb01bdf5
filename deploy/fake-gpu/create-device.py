#!/usr/bin/env python3
"""Set up the fake GPU in DIRECTORY (the volume deploy/compose.fake-gpu.yaml shares): the fake Level Zero
driver (libze_fake.so) and a 16 GiB Arc A770 with nothing held but the driver's own 256 MiB (ze.conf and its
ledger, tests/fakeze.py's SharedDevice), its Level Zero core total the whole 16 GiB as the replayed engines'
seed host has it (tests/vllmunit.py's SIXTEEN_GIB_GPU: chat's 0.75 of it serves alone). The replayed engines take and give back memory there; the exporter's
Level Zero loader loads the driver with

    ZE_ENABLE_ALT_DRIVERS=DIRECTORY/libze_fake.so FAKE_ZE_CONFIG=DIRECTORY/ze.conf ZES_ENABLE_SYSMAN=1

    python3 create-device.py DIRECTORY
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fakeze import SharedDevice  # noqa: E402
from vllmunit import SIXTEEN_GIB_GPU  # noqa: E402

DRIVER = "libze_fake.so"
CONFIG = "ze.conf"
RESERVED = 256 * 1024 * 1024  # what a real GPU's driver keeps: free below total with nothing running


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    directory = Path(argv[1])
    shutil.copyfile(HERE / DRIVER, directory / DRIVER)
    SharedDevice.create(directory / CONFIG, SIXTEEN_GIB_GPU, reserved=RESERVED)
    print(f"fake GPU {SIXTEEN_GIB_GPU.pci_address} ({SIXTEEN_GIB_GPU.name}) in {directory}: {DRIVER}, {CONFIG}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
