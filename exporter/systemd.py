"""Facts of systemd, not of the journal reader nor of the fold that use them.

The MESSAGE_IDs of PID 1's records about a unit (systemd 252, sd-messages.h; subjects as in
/usr/lib/systemd/catalog/systemd.catalog). The texts quoted are those systemd 252 writes with the
default StatusUnitFormat=combined ("<unit> - <Description>"); the MESSAGE_ID is what identifies a
record, its text is for people.
"""

MESSAGE_ID_UNIT_STARTING = "7d4958e842da4a758f6c1cdc7b36dcc5"
"""'Starting <unit> - <desc>...': a start job for the unit has begun execution (JOB_TYPE=start)."""
MESSAGE_ID_UNIT_STARTED = "39f53479d3a045ac8e11786248231fbf"
"""'Started <unit> - <desc>.': the start job finished successfully (JOB_RESULT=done)."""
MESSAGE_ID_UNIT_START_FAILED = "be02cf6855d2428ba40df7e9d022f03d"
"""'Failed to start <unit> - <desc>.': the start job failed (JOB_RESULT=failed)."""
MESSAGE_ID_UNIT_PROCESS_EXIT = "98e322203f7a4ed290d09fe03c09fe15"
"""'<unit>: Main process exited, code=exited, status=1/FAILURE' (EXIT_CODE=, EXIT_STATUS=)."""
MESSAGE_ID_UNIT_FAILURE_RESULT = "d9b373ed55a64feb8242e02dbe79a49c"
"""``<unit>: Failed with result 'exit-code'.``: the unit entered the failed state (UNIT_RESULT=)."""
MESSAGE_ID_UNIT_RESTART_SCHEDULED = "5eb03494b6584870a536b337290809b3"
"""'<unit>: Scheduled restart job, restart counter is at N.' (N_RESTARTS=)."""
MESSAGE_ID_UNIT_STOPPING = "de5b426a63be47a7b6ac3eaac82e2f6f"
"""'Stopping <unit> - <desc>...': a stop job has begun."""
MESSAGE_ID_UNIT_STOPPED = "9d1aaa27d60140bd96365438aad20286"
"""'Stopped <unit> - <desc>.': the stop job finished."""
MESSAGE_ID_UNIT_SUCCESS = "7ad2d189f7e94e70a38c781354912448"
"""'<unit>: Deactivated successfully.'"""
MESSAGE_ID_UNIT_RESOURCES = "ae8f7b866b0347b9af31fe1c80b127c0"
"""'<unit>: Consumed 1min 2.345s CPU time.'"""
MESSAGE_ID_SPAWN_FAILED = "641257651c1b4ec9a8624d7a40a9e1e7"
"""'<unit>: Failed at step EXEC spawning <path>: ...': logged by the forked child in the unit's
cgroup before exec, so it arrives as unit output (_SYSTEMD_UNIT=<unit>), not as a PID-1 record."""
