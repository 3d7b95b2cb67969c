#!/bin/sh
# examples/plot.sh CSV... - draw each CSV written by an example as a PNG beside it (x.csv -> x.png):
# the first column (the step) against every column after the epoch, one line each; empty (NaN)
# cells are skipped, so validation rows, written every few hundred steps, draw as points on a line.
# Needs gnuplot (Debian: gnuplot-nox).
set -eu
command -v gnuplot >/dev/null 2>&1 || { echo "plot.sh: gnuplot not found (Debian: apt-get install gnuplot-nox)" >&2; exit 1; }
[ $# -gt 0 ] || { echo "plot.sh: no CSV files given (run an example first: they write runs/*.csv)" >&2; exit 1; }
for csv in "$@"; do
    png=${csv%.csv}.png
    ncol=$(head -n 1 "$csv" | awk -F, '{ print NF }')
    title=$(basename "${csv%.csv}")
    gnuplot <<GP
set terminal pngcairo size 800,480 noenhanced font ",10"
set output "$png"
set datafile separator ","
set datafile missing "NaN"
set key autotitle columnhead top right
set title "$title"
set xlabel "step"
set grid
set logscale y
plot for [i=3:$ncol] "$csv" using 1:i with linespoints pointsize 0.6 lw 1.5
GP
    echo "$png"
done
