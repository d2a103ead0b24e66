python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site && python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1; export PYTHONUNBUFFERED=1; export REPLAYSSM_COMMIT=fbee17b
mkdir -p $OUT/prec; nvidia-smi --query-gpu=uuid,clocks.max.sm --format=csv > $OUT/prec/uuid.txt
OUT=$OUT/prec FI_STATES=fp16 STATES=fp16 WARM_S=0 FI_S=410 BUDGET_S=415 timeout 430 bash benchmarks/precision_gpu.sh fi-256 > $OUT/prec/run.log 2>&1; echo "rc $? at $SECONDS s" >> $OUT/prec/run.log
(cd $OUT && tar czf prec.tgz prec)
