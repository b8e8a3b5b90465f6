/* server/cli.h — subcommands of the autocompress binary. Each returns the process exit
 * status (0 ok, 1 failure, 2 usage) and prints its own errors to stderr. */
#ifndef AC_SERVER_CLI_H
#define AC_SERVER_CLI_H

int cli_serve(int argc, char **argv);
int cli_worker(int argc, char **argv);
int cli_run(int argc, char **argv);
int cli_inspect(int argc, char **argv);
int cli_generate(int argc, char **argv);
int cli_perplexity(int argc, char **argv);
int cli_eval(int argc, char **argv);
int cli_calibrate(int argc, char **argv);
int cli_estimate(int argc, char **argv);
int cli_measure(int argc, char **argv);
int cli_prune(int argc, char **argv);
int cli_distill(int argc, char **argv);
int cli_search(int argc, char **argv);
int cli_export(int argc, char **argv);
int cli_healthcheck(int argc, char **argv);

#endif
