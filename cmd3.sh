python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site && python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1; export PYTHONUNBUFFERED=1; export REPLAYSSM_COMMIT=1dc5868
mkdir -p $OUT/p $OUT/t; nvidia-smi --query-gpu=uuid,clocks.max.sm --format=csv > $OUT/p/uuid.txt
(OUT=$OUT/prec FI_STATES=fp16 STATES=fp16 WARM_S=0 BUDGET_S=430 bash benchmarks/precision_gpu.sh fi-256 > $OUT/p/prec.log 2>&1; echo "prec rc $? at $SECONDS s" >> $OUT/p/steps.txt) &
R=mamba2.replay:STEP_LAUNCH:replay-bf16-large
for v in base w4r128 w4 w4 w4r128 base; do case $v in base) f=heads=8;; w4r128) f=warps=4,maxnreg=128;; w4) f=warps=4;; esac; n=$(ls $OUT/p | grep -c "^$v-"); timeout 60 python benchmarks/profile_rows.py --set $R:$f -- -p nemotron-3-super-120b-a12b --batch 256 --state-dtype bf16,int8 --stochastic-rounding --no-phases --out $OUT/p/$v-$n.json > $OUT/p/$v-$n.txt 2>&1; echo "$v run $n rc $? at $SECONDS s" >> $OUT/p/steps.txt; done
timeout 60 python -m pytest -q -p no:cacheprovider tests/test_mamba2_rounding.py -k launch_variants > $OUT/t/tests.log 2>&1; echo "tests rc $? at $SECONDS s" >> $OUT/t/tests.log
wait; echo "all done at $SECONDS s" >> $OUT/p/steps.txt
(cd $OUT && tar czf p.tgz p t prec)
