// trainctl: the command line. Everything lives in the trainctl_cli library
// (client/cli/cli.h) so tests run the same code in-process.
#include <iostream>

#include "client/cli/cli.h"

int main(int argc, char** argv) { return trainctl::cli::RunCli(argc, argv, std::cout, std::cerr); }
