#!/usr/bin/env bash
# Draws bench/plots/*.png from the data files there (written by
# bench/ddp/run.sh and bench/coordinator/run.sh, which also call this). Needs gnuplot
# (apt-get install gnuplot-nox). Usage: bench/plot.sh
set -euo pipefail
cd "$(dirname "$0")/plots"
command -v gnuplot >/dev/null || { echo "plot.sh: gnuplot is missing (apt-get install gnuplot-nox)" >&2; exit 2; }

if [[ -f throughput.dat ]]; then
  gnuplot <<'GP'
set terminal pngcairo size 820,460 font ",11"
set output 'throughput.png'
set title "bench/ddp: training throughput, 2 ranks (Gloo) on 2 cores, median of runs"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set logscale y
set yrange [500:*]
set ylabel "samples/s, summed over ranks (log scale)"
set grid ytics
set key top right
plot 'throughput.dat' using 2:xtic(1) title 'trainctl' lc rgb '#1f77b4', \
     '' using 3 title 'PyTorch DDP (Python)' lc rgb '#ff7f0e'
GP
fi

if [[ -f loss-cnn-trainctl.dat && -f loss-cnn-python.dat ]]; then
  gnuplot <<'GP'
set terminal pngcairo size 820,460 font ",11"
set output 'loss-cnn.png'
set title "bench/ddp: training loss, CNN on Fashion-MNIST, 2 ranks, batch 64/rank (rank 0, mean per window)"
set xlabel "optimizer step"
set ylabel "training loss"
set grid
set key top right
plot 'loss-cnn-trainctl.dat' using 1:2 with linespoints pt 7 ps 0.5 lw 2 title 'trainctl', \
     'loss-cnn-python.dat' using 1:2 with linespoints pt 5 ps 0.5 lw 2 title 'PyTorch DDP (Python)'
GP
fi
if [[ -f telemetry.dat ]]; then
  gnuplot <<'GP'
set terminal pngcairo size 820,500 font ",11"
set output 'telemetry.png'
set title "bench/coordinator: telemetry at scale, second by second (sizes: RESULTS.md)"
set xlabel "second of the steady window"
set ylabel "p99 latency (ms)"
set y2label "coordinator CPU (cores)"
set ytics nomirror
set y2tics
set yrange [0:*]
set y2range [0:*]
set grid
set key below horizontal
plot 'telemetry.dat' using 1:3 with linespoints pt 7 ps 0.5 lw 2 title 'heartbeat round trip p99', \
     '' using 1:4 with linespoints pt 5 ps 0.5 lw 2 title 'metric ingest p99 (rank → watcher)', \
     '' using 1:2 axes x1y2 with lines lw 2 dt 2 title 'coordinator CPU (right axis)'
GP
fi

ls -1 *.png 2>/dev/null || true
