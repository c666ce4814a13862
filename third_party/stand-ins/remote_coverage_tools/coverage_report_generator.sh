#!/bin/sh
echo "coverage reports are not supported in this workspace (no remote_coverage_tools can be fetched)" >&2
exit 1
