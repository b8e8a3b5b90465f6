-- wrk script: POST /v1/jobs with a small test-pipeline spec (the server runs with
-- AC_TEST_STAGES=1); every request creates and durably commits one job.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":{"path":"models/tiny.bin"},"constraints":{"latency_ms":50},' ..
           '"x_test_pipeline":["test_sleep"],"x_test_sleep_ms":600000}'
