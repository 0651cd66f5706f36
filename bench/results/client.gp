# gnuplot script written by bench/client/report.lua; draws client.png from client.dat
set terminal pngcairo size 1100,460 font ",10"
set output "/work/main/bench/results/client.png"
set multiplot layout 1,2 title "esx client benchmark (2026-12-02 11:42 UTC)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set grid ytics
set key top left
set title "searches/s, canned nginx (1 worker)"
set yrange [0:*]
plot "/work/main/bench/results/client.dat" index 0 using 2:xtic(1) title "c=1", "" index 0 using 3 title "c=16"
set title "bulk gzip through esx: % saved (bars; targets 80/90 dashed), MB/s (lines)"
set xrange [-0.5:2.5]
set yrange [0:125]
set ytics 0,20,100
set y2range [0:*]
set arrow 1 from graph 0, first 80 to graph 1, first 80 nohead dt 2 lc rgb "gray40"
set arrow 2 from graph 0, first 90 to graph 1, first 90 nohead dt 2 lc rgb "gray40"
set y2tics
set ylabel "% bytes saved"
set y2label "MB/s"
set key top center horizontal maxcols 2
plot "/work/main/bench/results/client.dat" index 1 using 2:xtic(sprintf("level %d", $1)) title "events % saved", \
     "" index 1 using 3 title "products % saved", \
     "" index 1 using 0:4 axes x1y2 with linespoints lw 2 title "events MB/s", \
     "" index 1 using 0:5 axes x1y2 with linespoints lw 2 title "products MB/s"
unset multiplot
