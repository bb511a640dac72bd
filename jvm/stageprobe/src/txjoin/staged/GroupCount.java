package txjoin.staged;

import java.util.Collections;
import java.util.Iterator;
import org.apache.spark.api.java.function.FlatMapGroupsWithStateFunction;
import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.streaming.GroupState;
import org.apache.spark.sql.streaming.GroupStateTimeout;
import org.apache.spark.sql.streaming.OutputMode;
import scala.Tuple2;

/**
 * Issue 65's probe of a stateful stage in the JVM before the shards (scripts/staged_stage_cost.py):
 * rows grouped by {@code value % groups} (a transaction group), each group's running count kept
 * in Spark's state store by {@code flatMapGroupsWithState} (Append), one report row a group and
 * micro-batch. Not a part of txjoin's pipeline: what it measures is what such a stage costs.
 */
public final class GroupCount {
  private GroupCount() {}

  /** {@code raw}'s first column a long; the result's columns {@code grp, seen}. */
  public static Dataset<Row> reports(Dataset<Row> raw, long groups) {
    FlatMapGroupsWithStateFunction<Long, Row, Long, Tuple2<Long, Long>> count =
        (Long key, Iterator<Row> rows, GroupState<Long> state) -> {
          long seen = state.exists() ? state.get() : 0L;
          while (rows.hasNext()) {
            rows.next();
            seen++;
          }
          state.update(seen);
          return Collections.singletonList(new Tuple2<>(key, seen)).iterator();
        };
    return raw.groupByKey((MapFunction<Row, Long>) r -> r.getLong(0) % groups, Encoders.LONG())
        .flatMapGroupsWithState(count, OutputMode.Append(), Encoders.LONG(),
            Encoders.tuple(Encoders.LONG(), Encoders.LONG()), GroupStateTimeout.NoTimeout())
        .toDF("grp", "seen");
  }
}
