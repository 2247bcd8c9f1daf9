#!/bin/sh
# Prints a greeting for the name given as the first argument (default: world).
name="${1:-world}"
echo "Hello, $nmae!"
