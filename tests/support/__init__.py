"""Helpers the tests share (a newcomer finds them here, not in another test module; no test module
imports another, and bench/ imports only from here):

    server_process   a real server process on a free port (`python -m engine serve`, `python app.py`)
    waiting          wait_for: poll a condition with a deadline
    live_lab         a live lab on the real model, started and stopped around a test
    app_page         driving the app's pages in Chromium (levers, predictions, screenshots)
    browser_pages    a Playwright page that collects its console errors and dialogs
    attention_cases  random paged KV caches, the Triton kernels, dense attention as the reference
    hf_check         the engine's greedy tokens against HF's recorded ones
    hf_folder        an HF safetensors folder written from the GGUF
    replicas         a request's events to its end, whether a process is gone, a failing rank
    failure_traffic  the failure rows' traffic, percentiles and ratios (with messages saying them)
    autoscaler_fakes a fake fleet for the autoscaler on a virtual clock
    scheduler_fakes  a fake model step for the scheduler
    lesson_files     a valid lesson file to break one way at a time
    watchers         the watchers load test's pinned server and closed-loop streams
    worker_jobs      runs for the what-if worker's process
    busy_core        one core kept busy on demand (`make test-fast-busy`)
"""
