/* tests/unit/test_server_config.c — `autocompress serve` settings (server/config.c) for
 * the connection limits: the per-IP limit defaults to a quarter of --max-connections (so
 * one address never holds them all) unless it is set; --request-deadline-s defaults to
 * 30, takes 0 (none) and is read from AC_REQUEST_DEADLINE_S; flags beat the environment;
 * bad values are refused with the flag's name.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "server/config.h"

static const char *const envs[] = {"AC_MAX_CONNECTIONS", "AC_PER_IP_CONNECTIONS", "AC_REQUEST_DEADLINE_S",
                                   "AC_ARTIFACTS", "AC_S3_CREDENTIALS_FILE", "AC_S3_ALLOW_HTTP", NULL};

static int setup(void **state)
{
    (void)state;
    for (int i = 0; envs[i]; i++)
        unsetenv(envs[i]);
    return 0;
}

static int parse(srv_config *c, char *err, size_t errlen, int argc, const char **argv)
{
    return srv_config_parse(argc, (char **)argv, c, err, errlen);
}

static void test_defaults(void **state)
{
    (void)state;
    srv_config c;
    char err[256] = "";
    const char *argv[] = {"serve"};
    assert_int_equal(parse(&c, err, sizeof err, 1, argv), 0);
    assert_int_equal(c.max_connections, 1024);
    assert_int_equal(c.per_ip_connections, 256);
    assert_true(c.per_ip_connections < c.max_connections);
    assert_int_equal(c.request_deadline_s, 30);
    srv_config_free(&c);
}

static void test_per_ip_follows_max_unless_set(void **state)
{
    (void)state;
    srv_config c;
    char err[256] = "";
    const char *a1[] = {"serve", "--max-connections", "16"};
    assert_int_equal(parse(&c, err, sizeof err, 3, a1), 0);
    assert_int_equal(c.per_ip_connections, 4);
    srv_config_free(&c);
    const char *a2[] = {"serve", "--max-connections", "2"};
    assert_int_equal(parse(&c, err, sizeof err, 3, a2), 0);
    assert_int_equal(c.per_ip_connections, 1);
    srv_config_free(&c);
    const char *a3[] = {"serve", "--max-connections", "16", "--per-ip-connections", "16"};
    assert_int_equal(parse(&c, err, sizeof err, 5, a3), 0);
    assert_int_equal(c.per_ip_connections, 16); /* set: kept (the server warns) */
    srv_config_free(&c);
    setenv("AC_MAX_CONNECTIONS", "40", 1);
    const char *a4[] = {"serve"};
    assert_int_equal(parse(&c, err, sizeof err, 1, a4), 0);
    assert_int_equal(c.per_ip_connections, 10);
    srv_config_free(&c);
}

static void test_deadline_env_flag_and_bad_values(void **state)
{
    (void)state;
    srv_config c;
    char err[256] = "";
    setenv("AC_REQUEST_DEADLINE_S", "7", 1);
    const char *a1[] = {"serve"};
    assert_int_equal(parse(&c, err, sizeof err, 1, a1), 0);
    assert_int_equal(c.request_deadline_s, 7);
    srv_config_free(&c);
    const char *a2[] = {"serve", "--request-deadline-s=0"};
    assert_int_equal(parse(&c, err, sizeof err, 2, a2), 0);
    assert_int_equal(c.request_deadline_s, 0);
    srv_config_free(&c);
    const char *a3[] = {"serve", "--request-deadline-s", "-1"};
    assert_int_equal(parse(&c, err, sizeof err, 3, a3), -1);
    assert_non_null(strstr(err, "--request-deadline-s"));
    srv_config_free(&c);
    setenv("AC_REQUEST_DEADLINE_S", "soon", 1);
    assert_int_equal(parse(&c, err, sizeof err, 1, a1), -1);
    assert_non_null(strstr(err, "AC_REQUEST_DEADLINE_S"));
    srv_config_free(&c);
}

/* --artifacts takes s3:// URLs only, and what the server was given reaches the workers
 * through the environment (they open the artifact store the same way). */
static void test_artifacts_settings_reach_the_workers(void **state)
{
    (void)state;
    srv_config c;
    char err[256] = "";
    const char *a1[] = {"serve", "--artifacts", "s3://bucket/pre", "--s3-allow-http", "--s3-credentials-file",
                        "/run/creds"};
    assert_int_equal(parse(&c, err, sizeof err, 6, a1), 0);
    assert_string_equal(c.artifacts, "s3://bucket/pre");
    assert_int_equal(c.s3_allow_http, 1);
    assert_string_equal(getenv("AC_ARTIFACTS"), "s3://bucket/pre");
    assert_string_equal(getenv("AC_S3_CREDENTIALS_FILE"), "/run/creds");
    assert_string_equal(getenv("AC_S3_ALLOW_HTTP"), "1");
    srv_config_free(&c);
    const char *a2[] = {"worker"};   /* a worker reads them back */
    assert_int_equal(parse(&c, err, sizeof err, 1, a2), 0);
    assert_string_equal(c.artifacts, "s3://bucket/pre");
    assert_int_equal(c.s3_allow_http, 1);
    srv_config_free(&c);
    const char *a3[] = {"serve", "--artifacts", "https://bucket/pre"};
    assert_int_equal(parse(&c, err, sizeof err, 3, a3), -1);
    assert_non_null(strstr(err, "--artifacts"));
    srv_config_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_defaults, setup),
        cmocka_unit_test_setup(test_per_ip_follows_max_unless_set, setup),
        cmocka_unit_test_setup(test_deadline_env_flag_and_bad_values, setup),
        cmocka_unit_test_setup(test_artifacts_settings_reach_the_workers, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
