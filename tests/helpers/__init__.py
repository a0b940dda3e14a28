"""Helpers of the reliability tests: a fork server that runs writer jobs in child processes (so
they can be SIGKILLed or resource-limited), the jobs it runs, and a test-only LD_PRELOAD fault
injector (fault_inject.c). Nothing here is imported by eagle_io itself."""
